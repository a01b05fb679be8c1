package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agemem/agemem/internal/pgschema"
	"github.com/agemem/agemem/internal/pgtest"
	"github.com/agemem/agemem/memtools/ltm"
)

// replicaEnv, set, makes the test binary a serve replica (runReplica):
// the replica tests run real processes they can SIGKILL.
const replicaEnv = "AGEMEM_SERVE_REPLICA"

func TestMain(m *testing.M) {
	if spec := os.Getenv(replicaEnv); spec != "" {
		os.Exit(runReplica(spec))
	}
	os.Exit(m.Run())
}

// replicaSpec is what a replica process serves.
type replicaSpec struct {
	Addr    string // listen address
	DSN     string // memory store and state
	Tenants int    // sk-soak-N keys (soakKeys)
}

// runReplica serves the scripted policy on spec's database until SIGTERM,
// logging JSON to stderr.
func runReplica(spec string) int {
	var rs replicaSpec
	if err := json.Unmarshal([]byte(spec), &rs); err != nil {
		fmt.Fprintln(os.Stderr, replicaEnv, err)
		return 2
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	c := defaults()
	c.Agent.SystemPrompt = "compact"
	c.Serve.KeysEnv = ""
	soakKeys(&c, rs.Tenants)
	c.StateDSN = rs.DSN
	h := c.Memory.HNSW
	h.MinRows = 0
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	db, err := ltm.OpenPostgres(ctx, ltm.PostgresOptions{DSN: rs.DSN, HNSW: h, Lazy: true, Log: log})
	if err != nil {
		log.Error("open the store", "err", err)
		return 1
	}
	defer db.Close()
	s, err := New(with(c.options(), func(o *Options) { o.Backend, o.Store, o.Logger = newScripted(), db, log }))
	if err != nil {
		log.Error("new server", "err", err)
		return 1
	}
	ln, err := net.Listen("tcp", rs.Addr)
	if err != nil {
		log.Error("listen", "err", err)
		return 1
	}
	if err := s.Serve(ctx, ln); err != nil {
		log.Error("serve", "err", err)
		return 1
	}
	return 0
}

// replica is a serve process of the test's.
type replica struct {
	name, addr, spec string
	log              string // its stderr, appended to across restarts
	cmd              *exec.Cmd
	exited           chan struct{}
}

func newReplica(t *testing.T, name, dsn string, tenants int) *replica {
	spec, _ := json.Marshal(replicaSpec{Addr: freeAddr(t), DSN: dsn, Tenants: tenants})
	r := &replica{name: name, spec: string(spec), log: filepath.Join(t.TempDir(), name+".log")}
	json.Unmarshal(spec, &struct{ Addr *string }{&r.addr})
	t.Cleanup(func() {
		if r.cmd != nil {
			r.cmd.Process.Kill()
			<-r.exited
		}
		if t.Failed() {
			raw, _ := os.ReadFile(r.log)
			t.Logf("%s's log (the last 2 KiB):\n%s", r.name, raw[max(0, len(raw)-2048):])
		}
	})
	return r
}

// start runs the process (again) and waits until it answers /healthz.
func (r *replica) start(t *testing.T) {
	t.Helper()
	if err := r.launch(); err != nil {
		t.Fatal(err)
	}
	r.await(t, "/healthz")
}

// launch runs the process without waiting for it to listen.
func (r *replica) launch() error {
	f, err := os.OpenFile(r.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), replicaEnv+"="+r.spec)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		return err
	}
	r.cmd, r.exited = cmd, make(chan struct{})
	go func(done chan struct{}) { cmd.Wait(); close(done) }(r.exited)
	return nil
}

// await waits until the replica answers path with 200.
func (r *replica) await(t *testing.T, path string) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; {
		if resp, err := http.Get("http://" + r.addr + path); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		select {
		case <-r.exited:
			raw, _ := os.ReadFile(r.log)
			t.Fatalf("%s exited:\n%s", r.name, raw)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not answer %s", r.name, path)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kill ends the process with SIGKILL: no shutdown, connections cut.
func (r *replica) kill() {
	r.cmd.Process.Signal(syscall.SIGKILL)
	<-r.exited
	r.cmd = nil
}

// logged counts the lines of the replica's log whose msg is msg.
func (r *replica) logged(t *testing.T, msg string) int {
	raw, err := os.ReadFile(r.log)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(raw), "\n") {
		var m struct{ Msg string }
		if json.Unmarshal([]byte(l), &m) == nil && m.Msg == msg {
			n++
		}
	}
	return n
}

// haproxyFor runs HAProxy round-robin over the replicas, as docs/serving.md
// configures it: /readyz health checks, so a replica that cannot reach the
// database or is gone gets no requests; a request whose connection failed
// or whose replica died before answering is sent to another (the
// Idempotency-Key makes that safe for writes); its own 503 (no replica
// ready) carries Retry-After. It returns the frontend's address.
func haproxyFor(t *testing.T, rs []*replica) string {
	t.Helper()
	front := freeAddr(t)
	dir := t.TempDir()
	e503 := filepath.Join(dir, "503.http")
	os.WriteFile(e503, []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n"+
		`{"error":{"message":"no serve replica is ready; retry after Retry-After","type":"server_error","code":"no_replica"}}`+"\n"), 0o644)
	var servers strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&servers, "    server %s %s check\n", r.name, r.addr)
	}
	cfg := fmt.Sprintf(`global
    maxconn 4000

defaults
    mode http
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    timeout http-request 10s
    timeout check 3s
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response response-timeout
    option http-buffer-request
    errorfile 503 %s

frontend serve_in
    bind %s
    default_backend serve

backend serve
    balance roundrobin
    option httpchk GET /readyz
    http-check expect status 200
    default-server inter 500ms fall 2 rise 1
%s`, e503, front, servers.String())
	runHAProxy(t, cfg, front)
	return front
}

// Two replicas started at once on an empty database: the schema is
// migrated once (one replica logs each migration, the other finds it
// done), and both serve.
func TestReplicasStartTogether(t *testing.T) {
	haproxyBin(t)
	dsn, schema := pgtest.Schema(t)
	rs := []*replica{newReplica(t, "r1", dsn, 1), newReplica(t, "r2", dsn, 1)}
	var wg sync.WaitGroup
	errs := make([]error, len(rs))
	for i, r := range rs {
		wg.Go(func() { errs[i] = r.launch() })
	}
	wg.Wait()
	for i, r := range rs {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		r.await(t, "/readyz")
	}
	for _, msg := range []string{"migrated the memory schema", "migrated the serve schema"} {
		if n := rs[0].logged(t, msg) + rs[1].logged(t, msg); n != 1 {
			t.Fatalf("%q logged %d times by two replicas starting together, want 1", msg, n)
		}
	}
	c := pgtest.Conn(t, dsn)
	for comp, want := range map[string]int{"memory": ltm.PostgresSchemaVersion, "serve": len(pgStateMigrations)} {
		if v, err := pgschema.Version(context.Background(), c, comp); err != nil || v != want {
			t.Fatalf("schema %s of %s: version %d (%v), want %d", comp, schema, v, err, want)
		}
	}
	for i, r := range rs {
		body := chatBody("s", fmt.Sprint("hello from replica ", i))
		if resp := do(t, "POST", "http://"+r.addr+"/v1/chat/completions", "sk-soak-0", body); resp.Status != 200 {
			t.Fatalf("%s: %d %s", r.name, resp.Status, resp.Body)
		}
	}
}
