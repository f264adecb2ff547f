package api

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/mqd/mqd/raftfsm"
	"github.com/mqd/mqd/replica"
	"github.com/valyala/fasthttp"
)

// backupFetchTimeout bounds the wait for a member's answer with one data
// group's copy (GET /v1/internal/groups/{id}/backup); reading its body,
// which is spooled to a temporary file, is bounded by the forwarding
// client's read timeout (server.go).
const backupFetchTimeout = 5 * time.Minute

// backupGroups answers GET /v1/cluster/backup while data groups exist: an
// archive (raftfsm/archive.go) of the metadata group's state, copied here
// first, and of every data group the directory records after that copy,
// each from this node's replica when it holds one that votes, else
// fetched from a member (the members in the directory's order, with the node's
// credentials). Each copy is consistent at its own applied index; there
// is no cross-group point in time. Every copy is taken (and the remote
// ones spooled to temporary files) before the answer starts, so a group
// no member can copy fails the request with 503 rather than cutting an
// archive short. Mq-Applied-Index is the metadata group's.
func (s *Server) backupGroups(ctx *fasthttp.RequestCtx, gn groupedNode) error {
	taken := time.Now()
	meta, err := s.node.Backup()
	if err != nil {
		return err
	}
	parts := []raftfsm.ArchivePart{{ArchiveGroup: raftfsm.ArchiveGroup{ID: replica.DefaultGroup, File: replica.DefaultGroup + ".db",
		AppliedIndex: meta.Index, Size: meta.Size, From: s.node.ID()}, Data: meta.File}}
	dir := gn.Directory()
	ids := make([]string, 0, len(dir.Groups))
	for id := range dir.Groups {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		p, err := s.groupCopy(gn, id, dir.Groups[id])
		if err != nil {
			for _, p := range parts {
				p.Data.Close()
			}
			return err
		}
		parts = append(parts, p)
	}
	pr, pw := io.Pipe()
	go func() { // ends when the archive is written or the answer is dropped (fasthttp closes pr)
		pw.CloseWithError(raftfsm.WriteArchive(pw, s.node.ID(), taken, parts))
	}()
	ctx.Response.Header.Set("Mq-Applied-Index", strconv.FormatUint(meta.Index, 10))
	ctx.Response.Header.Set("Mq-Backup-Groups", strconv.Itoa(len(parts)))
	ctx.Response.Header.Set("Content-Disposition",
		fmt.Sprintf(`attachment; filename="mqd-backup-%d.tar"`, meta.Index))
	ctx.SetContentType("application/x-tar")
	ctx.SetStatusCode(200)
	ctx.SetBodyStream(&deadlineReader{r: pr, conn: ctx.Conn(), d: backupWriteTimeout}, -1)
	return nil
}

// groupCopy is data group id's copy for an archive: this node's replica's,
// or a member's.
func (s *Server) groupCopy(gn groupedNode, id string, members []string) (raftfsm.ArchivePart, error) {
	part := raftfsm.ArchivePart{ArchiveGroup: raftfsm.ArchiveGroup{ID: id, File: id + ".db", Members: members}}
	b, held, err := gn.GroupBackup(id)
	if held {
		if err != nil {
			return part, fmt.Errorf("data group %s: %w", id, err)
		}
		part.AppliedIndex, part.Size, part.From, part.Data = b.Index, b.Size, s.node.ID(), b.File
		return part, nil
	}
	nodes := s.state.Nodes()
	err = fmt.Errorf("%w: no member of data group %s has a known address", ErrUnavailable, id)
	for _, m := range members {
		info, ok := nodes[m]
		if !ok || info.HTTPAddr == "" || m == s.node.ID() {
			continue
		}
		ferr := s.fetchGroupCopy(gn, info.HTTPAddr, &part)
		if ferr == nil {
			part.From = m
			return part, nil
		}
		if errors.Is(ferr, raftfsm.ErrInsufficientStorage) {
			return part, ferr
		}
		err = fmt.Errorf("%w: no member of data group %s gave a copy of its state (%s: %v)", ErrUnavailable, id, m, ferr)
	}
	return part, err
}

// fetchGroupCopy asks the node at addr for its copy of part's group and
// spools it into part.Data.
func (s *Server) fetchGroupCopy(gn groupedNode, addr string, part *raftfsm.ArchivePart) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodGet)
	req.SetRequestURI("/v1/internal/groups/" + part.ID + "/backup")
	req.SetHost(addr)
	req.URI().SetScheme("http") // with TLS, the connection itself is mutual TLS (server.go)
	if s.opts.TLS == nil && s.opts.NodeToken != "" {
		req.Header.Set(fasthttp.HeaderAuthorization, "Bearer "+s.opts.NodeToken)
	}
	resp.StreamBody = true
	if err := s.fwd.DoDeadline(req, resp, time.Now().Add(backupFetchTimeout)); err != nil {
		return err
	}
	defer resp.CloseBodyStream() //nolint:errcheck // the answer is read or dropped
	if resp.StatusCode() != 200 {
		msg, _ := io.ReadAll(io.LimitReader(resp.BodyStream(), 1024))
		return fmt.Errorf("status %d: %s", resp.StatusCode(), bytes.TrimSpace(msg))
	}
	size := int64(resp.Header.ContentLength())
	index, err := strconv.ParseUint(string(resp.Header.Peek("Mq-Applied-Index")), 10, 64)
	if size < 0 || err != nil {
		return fmt.Errorf("an answer without a length or an applied index")
	}
	f, err := gn.SpoolBackup(resp.BodyStream(), size)
	if err != nil {
		return err
	}
	part.AppliedIndex, part.Size, part.Data = index, size, f
	return nil
}

// groupBackup answers GET /v1/internal/groups/{id}/backup, between nodes:
// this node's copy of data group id's state (as GET /v1/cluster/backup
// answers the default group's), 404 when it holds no replica of it.
func (s *Server) groupBackup(ctx *fasthttp.RequestCtx, r *route) error {
	id := r.dlqID // the path's {id}
	if err := replica.ValidateGroupID(id); err != nil || id == replica.DefaultGroup {
		return fmt.Errorf("%w: %q is not a data group id", ErrBadRequest, id)
	}
	gn, ok := s.grouped()
	if !ok {
		return fmt.Errorf("%w: this node has no data groups", ErrNotFound)
	}
	b, held, err := gn.GroupBackup(id)
	if !held {
		return fmt.Errorf("%w: this node holds no voting replica of data group %s", ErrNotFound, id)
	}
	if err != nil {
		return err
	}
	streamBackup(ctx, b, "mqd-group-"+id)
	return nil
}
