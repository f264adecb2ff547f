package clients

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// Every client's token and CA options, through its conformance driver,
// against a node serving https with a CA of the test's own and --auth-file:
// with the CA and the token a client publishes, fetches and acks; without
// the token it gets 401 with its code; without the CA, no answer (status 0:
// the certificate is not trusted). Skips like TestClientConformance.
func TestClientsTLSAndToken(t *testing.T) {
	t.Parallel()
	root, err := tc.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	drivers := conformanceDrivers(t, root)
	ca := tc.NewCA(t, "clients-ca")
	fx := tc.AuthTokens(t, map[string][]string{"ops": {"monitor", "admin:*"}, "app": {"publish:*", "consume:*", "admin:*"}})
	cl := tc.NewTLSClient(15*time.Second, 4, ca.Pool(), nil).WithToken(fx.Secrets["ops"])
	c := tc.Start(t, 1, tc.WithTLS(ca), tc.WithClient(cl), tc.WithFlags("--auth-file", fx.Path))
	n := c.Node(0)
	s := &conformanceSuite{t: t, c: c}
	for _, d := range drivers {
		t.Run(d.lang, func(t *testing.T) {
			topic := "tls-" + d.lang
			tc.MustTopic(t, n, topic, nil)
			runs := []struct {
				name   string
				client map[string]any
				steps  string
			}{
				{"ca and token", map[string]any{"ca_file": ca.CertPath(), "token": fx.Secrets["app"]}, `[
					{"op":"publish","topic":"$T","value":"v","key":"k1","attrs":{"a":"b"},"expect":{"ok":true,"value":{"duplicate":false}}},
					{"op":"fetch","topic":"$T","group":"g","max":1,"wait_ms":1000,"expect":{"ok":true,"value":{"keys":["k1"]}}},
					{"op":"ack","topic":"$T","group":"g","expect":{"ok":true,"value":{"statuses":["ok"]}}}]`},
				{"no token", map[string]any{"ca_file": ca.CertPath()}, `[
					{"op":"publish","topic":"$T","value":"v","key":"k2","expect":{"ok":false,"status":401,"code":"unauthenticated"}}]`},
				{"no ca", map[string]any{"token": fx.Secrets["app"], "max_attempts": 2}, `[
					{"op":"publish","topic":"$T","value":"v","key":"k3","expect":{"ok":false,"status":0}}]`},
			}
			for _, r := range runs {
				var steps []map[string]any
				if err := json.Unmarshal([]byte(strings.ReplaceAll(r.steps, "$T", topic)), &steps); err != nil {
					t.Fatal(err)
				}
				cs := conformanceCase{Name: r.name, Client: r.client, Steps: steps}
				lines, problems := s.drive(tc.CtxFor(t, time.Minute), t, d, cs, []string{n.URL()}, false)
				for i, st := range steps {
					if i >= len(lines) {
						problems = append(problems, "no outcome")
					} else if p := checkStep(st["expect"], lines[i]); p != "" {
						problems = append(problems, p)
					}
				}
				if len(problems) > 0 {
					t.Errorf("%s, %s: %s", d.lang, r.name, strings.Join(problems, "; "))
				}
			}
		})
	}
}
