package ops

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/mqd/mqd/test/systest"
	"go.yaml.in/yaml/v3"
)

// k8sObject is the part of a Kubernetes object the test reads.
type k8sObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec struct {
		// Service
		ClusterIP                string           `yaml:"clusterIP"`
		PublishNotReadyAddresses bool             `yaml:"publishNotReadyAddresses"`
		Selector                 yaml.Node        `yaml:"selector"` // a map (Service) or a label selector (others)
		Ports                    []k8sServicePort `yaml:"ports"`
		MinAvailable             int              `yaml:"minAvailable"`
		ServiceName              string           `yaml:"serviceName"`
		Replicas                 int              `yaml:"replicas"`
		PodManagementPolicy      string           `yaml:"podManagementPolicy"`
		Template                 k8sPodTemplate   `yaml:"template"`
		VolumeClaimTemplates     []k8sClaim       `yaml:"volumeClaimTemplates"`
	} `yaml:"spec"`
}

type k8sServicePort struct {
	Name       string `yaml:"name"`
	Port       int    `yaml:"port"`
	TargetPort string `yaml:"targetPort"`
}

type k8sClaim struct {
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
}

type k8sPodTemplate struct {
	Metadata struct {
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Spec struct {
		TerminationGracePeriodSeconds int            `yaml:"terminationGracePeriodSeconds"`
		Containers                    []k8sContainer `yaml:"containers"`
		Volumes                       []struct {
			Name string `yaml:"name"`
		} `yaml:"volumes"`
	} `yaml:"spec"`
}

type k8sContainer struct {
	Args []string `yaml:"args"`
	Env  []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom any    `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	ReadinessProbe k8sProbe `yaml:"readinessProbe"`
	LivenessProbe  k8sProbe `yaml:"livenessProbe"`
	VolumeMounts   []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

type k8sProbe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

// readK8s reads every object of the files deploy/kubernetes/kustomization.yaml lists.
func readK8s(t *testing.T) map[string]*k8sObject {
	t.Helper()
	var kust struct {
		Resources []string `yaml:"resources"`
	}
	if err := yaml.Unmarshal(systest.RepoFile(t, "deploy/kubernetes/kustomization.yaml"), &kust); err != nil || len(kust.Resources) == 0 {
		t.Fatalf("deploy/kubernetes/kustomization.yaml: %v, resources %v", err, kust.Resources)
	}
	objs := map[string]*k8sObject{}
	for _, f := range kust.Resources {
		dec := yaml.NewDecoder(bytes.NewReader(systest.RepoFile(t, filepath.Join("deploy/kubernetes", f))))
		for {
			o := &k8sObject{}
			err := dec.Decode(o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			objs[o.Kind+"/"+o.Metadata.Name] = o
		}
	}
	return objs
}

// labels decodes a Service's selector (a map) or another object's
// (matchLabels).
func labels(t *testing.T, n yaml.Node) map[string]string {
	t.Helper()
	var plain map[string]string
	if err := n.Decode(&plain); err == nil {
		return plain
	}
	var sel struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	}
	if err := n.Decode(&sel); err != nil {
		t.Fatalf("selector: %v", err)
	}
	return sel.MatchLabels
}

// deploy/kubernetes/: the StatefulSet's command line is made of server
// flags with every $(VAR) defined; each pod's id is its name, it
// advertises and joins by the headless Service's stable names, expects as
// many nodes as there are replicas, keeps its data on a claim and probes
// /readyz and /healthz on its HTTP port; the Services and the
// PodDisruptionBudget select its pods, the budget keeps a quorum, and the
// grace period covers the graceful stop.
func TestDeployKubernetes(t *testing.T) {
	t.Parallel()
	flags := systest.ServerFlagSet(t)
	objs := readK8s(t)
	var sts *k8sObject
	for k, o := range objs {
		if strings.HasPrefix(k, "StatefulSet/") {
			sts = o
		}
	}
	if sts == nil {
		t.Fatalf("deploy/kubernetes: no StatefulSet among %v", slices.Collect(maps.Keys(objs)))
	}
	pod := sts.Spec.Template
	podLabels := pod.Metadata.Labels
	selects := func(what string, sel map[string]string) {
		t.Helper()
		for k, v := range sel {
			if podLabels[k] != v {
				t.Errorf("%s selects %v, the pods are labelled %v", what, sel, podLabels)
			}
		}
		if len(sel) == 0 {
			t.Errorf("%s selects nothing", what)
		}
	}
	selects("the StatefulSet", labels(t, sts.Spec.Selector))
	headless := objs["Service/"+sts.Spec.ServiceName]
	if headless == nil || headless.Spec.ClusterIP != "None" || !headless.Spec.PublishNotReadyAddresses {
		t.Fatalf("serviceName %q: want a headless Service (clusterIP None) that publishes not-ready addresses", sts.Spec.ServiceName)
	}
	selects("the headless Service", labels(t, headless.Spec.Selector))
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	defined := map[string]bool{}
	var envNames []string
	for _, e := range c.Env {
		defined[e.Name] = true
		envNames = append(envNames, e.Name)
	}
	systest.CheckEnvNames(t, "StatefulSet env", flags, envNames)
	for _, a := range c.Args {
		for _, m := range regexp.MustCompile(`\$\(([A-Z_]+)\)`).FindAllStringSubmatch(a, -1) {
			if !defined[m[1]] {
				t.Errorf("args use $(%s), which env does not define", m[1])
			}
		}
	}
	v := systest.ParseServeArgs(t, "StatefulSet args", flags, c.Args)
	replicas := sts.Spec.Replicas
	stable := func(pod, port string) string {
		return pod + "." + sts.Spec.ServiceName + ".$(POD_NAMESPACE).svc.cluster.local:" + port
	}
	httpPort, raftPort := systest.Port(t, "--http-addr", v["http-addr"]), systest.Port(t, "--raft-addr", v["raft-addr"])
	var joins []string
	for i := range replicas {
		joins = append(joins, stable(fmt.Sprintf("%s-%d", sts.Metadata.Name, i), httpPort))
	}
	for _, w := range []struct{ flag, want string }{
		{"id", "$(POD_NAME)"},
		{"http-advertise-addr", stable("$(POD_NAME)", httpPort)},
		{"raft-advertise-addr", stable("$(POD_NAME)", raftPort)},
		{"join", strings.Join(joins, ",")},
		{"bootstrap-expect", strconv.Itoa(replicas)},
	} {
		if v[w.flag] != w.want {
			t.Errorf("--%s %q, want %q", w.flag, v[w.flag], w.want)
		}
	}
	if replicas != 3 || sts.Spec.PodManagementPolicy != "Parallel" {
		t.Errorf("replicas %d, podManagementPolicy %q: want 3 started together (none is ready before a quorum runs)",
			replicas, sts.Spec.PodManagementPolicy)
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	if len(sts.Spec.VolumeClaimTemplates) != 1 || mounts[v["data-dir"]] != sts.Spec.VolumeClaimTemplates[0].Metadata.Name {
		t.Errorf("--data-dir %q is not on the pod's PersistentVolumeClaim (mounts %v)", v["data-dir"], mounts)
	}
	if f := v["auth-file"]; f != "" && mounts[filepath.Dir(f)] == "" {
		t.Errorf("--auth-file %q is on no mounted volume (mounts %v)", f, mounts)
	}
	ports := map[string]string{}
	for _, p := range c.Ports {
		ports[p.Name] = strconv.Itoa(p.ContainerPort)
	}
	if ports["http"] != httpPort || ports["raft"] != raftPort {
		t.Errorf("container ports %v, want http %s and raft %s as the flags listen", ports, httpPort, raftPort)
	}
	if r, l := c.ReadinessProbe.HTTPGet, c.LivenessProbe.HTTPGet; r.Path != "/readyz" || r.Port != "http" || l.Path != "/healthz" || l.Port != "http" {
		t.Errorf("probes: readiness %+v, liveness %+v; want /readyz and /healthz on port http", r, l)
	}
	// cmd/mqd/serve.go: hand-off and requests in flight within 6 s, raft 3 s
	// more; SIGKILL before would cut a hand-off short.
	if g := pod.Spec.TerminationGracePeriodSeconds; g < 15 {
		t.Errorf("terminationGracePeriodSeconds %d: a graceful stop takes up to 9 s, want at least 15", g)
	}
	var clients, pdb *k8sObject
	for k, o := range objs {
		switch {
		case strings.HasPrefix(k, "Service/") && o != headless:
			clients = o
		case strings.HasPrefix(k, "PodDisruptionBudget/"):
			pdb = o
		}
	}
	if clients == nil || len(clients.Spec.Ports) != 1 || clients.Spec.Ports[0].TargetPort != "http" {
		t.Errorf("want a Service for clients on the pods' http port")
	} else {
		selects("the clients' Service", labels(t, clients.Spec.Selector))
	}
	if pdb == nil || pdb.Spec.MinAvailable != replicas/2+1 {
		t.Errorf("want a PodDisruptionBudget keeping a quorum (minAvailable %d)", replicas/2+1)
	} else {
		selects("the PodDisruptionBudget", labels(t, pdb.Spec.Selector))
	}
}
