package api

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/raftfsm"
	"github.com/valyala/fasthttp"
)

func (s *Server) healthz(ctx *fasthttp.RequestCtx, _ *route) error {
	writeJSON(ctx, 200, map[string]any{"status": "ok", "id": s.node.ID()})
	return nil
}

func (s *Server) readyz(ctx *fasthttp.RequestCtx, _ *route) error {
	rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if v := s.node.Ready(rctx); !v.Ready {
		body := map[string]any{"ready": false, "applied_index": v.Applied, "commit_index": v.Commit, "reason": v.Reason}
		ctx.Response.Header.Set("Retry-After", "1") // as every 503
		writeJSON(ctx, 503, body)
		return nil
	}
	writeJSON(ctx, 200, map[string]any{"ready": true})
	return nil
}

type clusterNode struct {
	command.NodeInfo
	State         string `json:"state"`
	Voter         bool   `json:"voter"`
	LastContactMs int64  `json:"last_contact_ms"`
	AppliedIndex  uint64 `json:"applied_index"`
	CommitIndex   uint64 `json:"commit_index"`
	// StateFormatMax: the highest state format the member's binary reads
	// (0: older than formats, or not probed yet).
	StateFormatMax int `json:"state_format_max"`
	// TopicsLed and TopicsHeld: the topics whose replicas' leader this
	// member is, and the topics it holds a replica of (SPEC section 12).
	TopicsLed  int `json:"topics_led"`
	TopicsHeld int `json:"topics_held"`
}

// cluster answers GET /v1/cluster: every member as this node sees it. The
// node itself reports its raft state and, as a follower, the time since it
// last heard from the leader; every other member is probed over HTTP
// (raftfsm/peers.go) and reports its own state, or is unreachable. A
// leader this node cannot reach is not named.
func (s *Server) cluster(ctx *fasthttp.RequestCtx, _ *route) error {
	servers, err := s.node.Servers()
	if err != nil {
		return err
	}
	infos := s.state.Nodes()
	lid, _, known := s.node.Leader()
	if known && lid != s.node.ID() && s.node.Peer(lid).State == "unreachable" {
		known = false
	}
	out := struct {
		Leader            *command.NodeInfo `json:"leader"`
		Nodes             []clusterNode     `json:"nodes"`
		Self              string            `json:"self"`
		AppliedIndex      uint64            `json:"applied_index"`
		CommitIndex       uint64            `json:"commit_index"`
		LastSnapshotIndex uint64            `json:"last_snapshot_index"`
		StateFormat       int               `json:"state_format"`
		Resources         raftfsm.Resources `json:"resources"`
		Alarms            []string          `json:"alarms"`
		Groups            []dataGroupJSON   `json:"groups,omitempty"`
	}{Nodes: []clusterNode{}, Self: s.node.ID(), AppliedIndex: s.state.AppliedIndex(),
		CommitIndex: s.node.CommitIndex(), LastSnapshotIndex: s.node.LastSnapshotIndex(),
		StateFormat: s.state.StateFormat(), Resources: s.node.Resources()}
	out.Alarms = alarms(out.Resources)
	topics := s.topicCount()
	out.Groups = s.dataGroupsJSON()
	for _, sv := range servers {
		info := infos[string(sv.ID)]
		info.ID, info.RaftAddr = string(sv.ID), string(sv.Address)
		cn := clusterNode{Voter: sv.Suffrage == raft.Voter}
		if info.ID == s.node.ID() {
			cn.NodeInfo, cn.State = s.node.Info(), s.node.StateName()
			cn.LastContactMs = s.node.LastContactMs()
			cn.AppliedIndex, cn.CommitIndex = out.AppliedIndex, out.CommitIndex
			cn.StateFormatMax = fsm.StateFormat
		} else {
			p := s.node.Peer(info.ID)
			cn.NodeInfo, cn.State, cn.LastContactMs = info, p.State, p.LastContactMs
			cn.AppliedIndex, cn.CommitIndex = p.AppliedIndex, p.CommitIndex
			cn.StateFormatMax = p.StateFormatMax
			if !p.Probed { // not asked yet (just started): raft's view
				cn.State = "follower"
				if known && info.ID == lid {
					cn.State = "leader"
				}
			}
		}
		if known && info.ID == lid {
			l := cn.NodeInfo
			out.Leader = &l
			cn.TopicsLed = topics
		}
		if cn.Voter { // the default group's topics (placement in topics.go)
			cn.TopicsHeld = topics
		}
		for _, g := range out.Groups {
			if slices.Contains(g.Members, info.ID) {
				cn.TopicsHeld += g.Topics
			}
			if g.Leader == info.ID {
				cn.TopicsLed += g.Topics
			}
		}
		out.Nodes = append(out.Nodes, cn)
	}
	writeJSON(ctx, 200, out)
	return nil
}

// dataGroupJSON is one data group in GET /v1/cluster: its members (the
// preferred leader first), its leader as this node knows it (by raft when
// it holds a replica, else from the probes: raftfsm/leaders.go), and the
// topics placed in it.
type dataGroupJSON struct {
	ID      string   `json:"id"`
	Members []string `json:"members"`
	Leader  string   `json:"leader,omitempty"`
	Topics  int      `json:"topics"`
}

// dataGroupsJSON lists the directory's data groups, by id.
func (s *Server) dataGroupsJSON() []dataGroupJSON {
	gn, ok := s.grouped()
	if !ok {
		return nil
	}
	dir := gn.Directory()
	counts := dir.Counts()
	out := make([]dataGroupJSON, 0, len(dir.Groups))
	for id, ms := range dir.Groups {
		g := dataGroupJSON{ID: id, Members: ms, Topics: counts[id]}
		g.Leader, _, _ = gn.GroupLeader(id)
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b dataGroupJSON) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// topicCount is how many topics the state holds.
func (s *Server) topicCount() int {
	n := 0
	_ = s.state.Read(func(r *fsm.Reader) error {
		r.EachTopicAfter("", func(string) bool { n++; return true })
		return nil
	})
	return n
}

// removeNode answers DELETE /v1/cluster/nodes/{id} on the leader.
func (s *Server) removeNode(ctx *fasthttp.RequestCtx, r *route) error {
	id := r.dlqID // the path's {id}
	if err := s.node.RemoveNode(r.ctx, id); err != nil {
		return err
	}
	writeJSON(ctx, 200, map[string]any{"removed": id})
	return nil
}

// acceptClock accepts this node's clock when, the only voter, it refuses
// to lead because its clock jumped ahead while it was down (timeline.go).
func (s *Server) acceptClock(ctx *fasthttp.RequestCtx, _ *route) error {
	if err := optBody(ctx.PostBody(), &struct{}{}); err != nil {
		return err
	}
	ahead, accepted := s.node.AcceptClock()
	writeJSON(ctx, 200, map[string]any{"accepted": accepted, "ahead_ms": ahead.Milliseconds()})
	return nil
}

func (s *Server) status(ctx *fasthttp.RequestCtx, _ *route) error {
	writeJSON(ctx, 200, s.node.Status())
	return nil
}

func (s *Server) join(ctx *fasthttp.RequestCtx, r *route) error {
	var info command.NodeInfo
	if err := decodeStrict(ctx.PostBody(), &info); err != nil {
		return err
	}
	if info.ID == "" || info.HTTPAddr == "" || info.RaftAddr == "" {
		return ErrBadRequest
	}
	// A new member's id must be one a URL and a log line carry as it is
	// (a binary older than the rule may send any); a recorded one stays.
	if err := raftfsm.ValidateNodeID(info.ID); err != nil && !s.node.IsMember(info.ID) {
		return fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	if err := s.node.Join(r.ctx, info); err != nil {
		return err
	}
	writeJSON(ctx, 200, map[string]any{"joined": info.ID})
	return nil
}

// backup answers GET /v1/cluster/backup on the node that receives it (a
// follower too; no forwarding): the state machine as one bbolt read
// transaction saw it, copied to a temporary file first and then streamed
// (raftfsm.Node.Backup). Mq-Applied-Index names the raft index the copy
// is consistent at. With data groups the answer is an archive of every
// group's state (backupGroups).
func (s *Server) backup(ctx *fasthttp.RequestCtx, _ *route) error {
	if gn, ok := s.grouped(); ok && len(gn.Directory().Groups) > 0 {
		return s.backupGroups(ctx, gn)
	}
	b, err := s.node.Backup()
	if err != nil {
		return err
	}
	streamBackup(ctx, b, "mqd-backup")
	return nil
}

// streamBackup answers with backup b's file.
func streamBackup(ctx *fasthttp.RequestCtx, b *fsm.Backup, name string) {
	ctx.Response.Header.Set("Mq-Applied-Index", strconv.FormatUint(b.Index, 10))
	ctx.Response.Header.Set("Content-Disposition",
		fmt.Sprintf(`attachment; filename="%s-%d.db"`, name, b.Index))
	ctx.SetContentType("application/octet-stream")
	ctx.SetStatusCode(200)
	// fasthttp sets the write deadline (30 s) once for the whole answer:
	// each read of the body moves it on, so that a large backup is cut off
	// only when the client stops reading, not when it takes long.
	ctx.SetBodyStream(&deadlineReader{r: b.File, conn: ctx.Conn(), d: backupWriteTimeout}, int(b.Size))
}

const backupWriteTimeout = 30 * time.Second

// deadlineReader is the backup's body stream: it extends the connection's
// write deadline before each read and closes the file at the end (fasthttp
// closes a body stream that is an io.Closer).
type deadlineReader struct {
	r    io.ReadCloser
	conn net.Conn
	d    time.Duration
}

func (r *deadlineReader) Read(p []byte) (int, error) {
	_ = r.conn.SetWriteDeadline(time.Now().Add(r.d))
	return r.r.Read(p)
}

func (r *deadlineReader) Close() error { return r.r.Close() }
