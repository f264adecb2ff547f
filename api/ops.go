package api

import (
	"github.com/mqd/mqd/raftfsm"
	"github.com/valyala/fasthttp"
)

func (s *Server) healthz(ctx *fasthttp.RequestCtx, _ *route) error {
	writeJSON(ctx, 200, map[string]any{"status": "ok", "id": s.node.ID()})
	return nil
}

func (s *Server) readyz(ctx *fasthttp.RequestCtx, _ *route) error {
	if !s.node.Ready() {
		writeJSON(ctx, 503, map[string]any{"ready": false, "applied_index": s.node.FSM.AppliedIndex(),
			"commit_index": s.node.Raft.CommitIndex()})
		return nil
	}
	writeJSON(ctx, 200, map[string]any{"ready": true})
	return nil
}

type clusterNode struct {
	raftfsm.NodeInfo
	State string `json:"state"`
	Voter bool   `json:"voter"`
}

func (s *Server) cluster(ctx *fasthttp.RequestCtx, _ *route) error {
	servers, err := s.node.Servers()
	if err != nil {
		return err
	}
	infos := s.node.FSM.Nodes()
	lid, _, known := s.node.Leader()
	out := struct {
		Leader            *raftfsm.NodeInfo `json:"leader"`
		Nodes             []clusterNode     `json:"nodes"`
		Self              string            `json:"self"`
		AppliedIndex      uint64            `json:"applied_index"`
		CommitIndex       uint64            `json:"commit_index"`
		LastSnapshotIndex uint64            `json:"last_snapshot_index"`
	}{Nodes: []clusterNode{}, Self: s.node.ID(), AppliedIndex: s.node.FSM.AppliedIndex(),
		CommitIndex: s.node.Raft.CommitIndex(), LastSnapshotIndex: s.node.LastSnapshotIndex()}
	for _, sv := range servers {
		info := infos[string(sv.ID)]
		info.ID, info.RaftAddr = string(sv.ID), string(sv.Address)
		if info.ID == s.node.ID() {
			info = s.node.Info()
		}
		cn := clusterNode{NodeInfo: info, State: "follower", Voter: sv.Suffrage == 0}
		if !known {
			cn.State = "unknown"
		}
		if known && info.ID == lid {
			cn.State = "leader"
			l := info
			out.Leader = &l
		}
		if info.ID == s.node.ID() {
			cn.State = stateName(s.node.Raft.State().String())
		}
		out.Nodes = append(out.Nodes, cn)
	}
	writeJSON(ctx, 200, out)
	return nil
}

func stateName(s string) string {
	switch s {
	case "Leader":
		return "leader"
	case "Follower":
		return "follower"
	case "Candidate":
		return "candidate"
	}
	return "unknown"
}

func (s *Server) status(ctx *fasthttp.RequestCtx, _ *route) error {
	writeJSON(ctx, 200, s.node.Status())
	return nil
}

func (s *Server) join(ctx *fasthttp.RequestCtx, r *route) error {
	var info raftfsm.NodeInfo
	if err := decodeStrict(ctx.PostBody(), &info); err != nil {
		return err
	}
	if info.ID == "" || info.HTTPAddr == "" || info.RaftAddr == "" {
		return ErrBadRequest
	}
	if err := s.node.Join(r.ctx, info); err != nil {
		return err
	}
	writeJSON(ctx, 200, map[string]any{"joined": info.ID})
	return nil
}
