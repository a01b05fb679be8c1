package serve

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// loadBalancer is a real HAProxy (Debian's) in front of a server: a TCP
// frontend that opens each connection to the server with a PROXY v1
// header (send-proxy), and an HTTP frontend that adds X-Forwarded-For and
// checks the server's health itself.
type loadBalancer struct {
	tcp, http string // the frontends' addresses
}

// startHAProxy runs HAProxy for the test's life. Without haproxy it skips,
// unless AGEMEM_REQUIRE_LB is set (CI installs it), when it fails.
func startHAProxy(t *testing.T, backend string) loadBalancer {
	t.Helper()
	haproxyBin(t)
	lb := loadBalancer{tcp: freeAddr(t), http: freeAddr(t)}
	cfg := fmt.Sprintf(`global
    maxconn 4000

defaults
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    timeout http-request 10s

frontend tcp_in
    mode tcp
    bind %s
    default_backend serve_proxy_protocol

backend serve_proxy_protocol
    mode tcp
    server serve %s send-proxy

frontend http_in
    mode http
    bind %s
    option forwardfor
    default_backend serve_http

backend serve_http
    mode http
    option httpchk
    http-check send meth GET uri /healthz
    server serve %s check inter 100ms fall 2
`, lb.tcp, backend, lb.http, backend)
	runHAProxy(t, cfg, lb.tcp, lb.http)
	return lb
}

// haproxyBin is Debian's haproxy. Without it the test skips, unless
// AGEMEM_REQUIRE_LB is set (CI installs it), when it fails.
func haproxyBin(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		if _, err2 := os.Stat("/usr/sbin/haproxy"); err2 == nil {
			bin, err = "/usr/sbin/haproxy", nil
		}
	}
	if err != nil {
		if os.Getenv("AGEMEM_REQUIRE_LB") != "" {
			t.Fatal("haproxy is not installed and AGEMEM_REQUIRE_LB is set (.ci/run installs Debian's haproxy)")
		}
		t.Skip("haproxy is not installed (Debian: apt-get install haproxy); set AGEMEM_REQUIRE_LB=1 to fail instead")
	}
	return bin
}

// freeAddr is a loopback address no one listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// runHAProxy runs HAProxy on cfg for the test's life and waits until it
// listens on every address of listen.
func runHAProxy(t *testing.T, cfg string, listen ...string) {
	t.Helper()
	bin := haproxyBin(t)
	path := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "-c", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("haproxy -c: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "-db", "-f", path)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
	for _, a := range listen {
		for deadline := time.Now().Add(10 * time.Second); ; {
			c, err := net.Dial("tcp", a)
			if err == nil {
				c.Close()
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("haproxy does not listen on %s: %v\n%s", a, err, out.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// clientFrom is an HTTP client whose connections come from the loopback
// address local: a client of its own, to the load balancer and to serve
// behind it.
func clientFrom(local string, keepAlive bool) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 4, DisableKeepAlives: !keepAlive}}
}

// attack keeps n stalled connections from local open through front until
// stop: raw is what each sends before it stalls. Each outcome is counted
// by the status the connection ends with ("closed": ended without one).
func attack(local, front, raw string, n int, stop <-chan struct{}, outcomes *sync.Map) *sync.WaitGroup {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 2 * time.Second}
				conn, err := d.Dial("tcp", front)
				if err != nil {
					time.Sleep(50 * time.Millisecond)
					continue
				}
				io.WriteString(conn, raw)
				go func() { <-stop; conn.Close() }()
				conn.SetReadDeadline(time.Now().Add(20 * time.Second))
				outcome := "closed"
				if resp, err := http.ReadResponse(bufio.NewReader(conn), nil); err == nil {
					body, _ := io.ReadAll(resp.Body)
					outcome = fmt.Sprint(resp.StatusCode)
					var e struct {
						Error struct{ Code string } `json:"error"`
					}
					if json.Unmarshal(body, &e) == nil && e.Error.Code != "" {
						outcome += " " + e.Error.Code
					}
				}
				conn.Close()
				v, _ := outcomes.LoadOrStore(outcome, new(atomic.Int64))
				v.(*atomic.Int64).Add(1)
			}
		})
	}
	return &wg
}

func tally(m *sync.Map) (map[string]int64, string) {
	out := map[string]int64{}
	var parts []string
	m.Range(func(k, v any) bool {
		out[k.(string)] = v.(*atomic.Int64).Load()
		parts = append(parts, fmt.Sprintf("%s: %d", k, out[k.(string)]))
		return true
	})
	sort.Strings(parts)
	return out, strings.Join(parts, ", ")
}

// TestSoakBehindLoadBalancer is the soak behind Debian's HAProxy, with
// serve.trusted_proxies naming it: honest clients, each from its own
// address, run the soak's mix through both frontends while one attacker
// keeps stalled connections open through the TCP frontend (PROXY
// protocol) and another stalled requests through the HTTP frontend
// (X-Forwarded-For), far past serve.max_connections_per_client, and a
// health checker polls from the attackers' own address. Before, the proxy
// was one client and the attackers locked everyone out, health checks
// included; now the attackers alone meet the cap: no honest request gets
// a 5xx, every health check answers, and HAProxy's own checks keep the
// server in rotation.
func TestSoakBehindLoadBalancer(t *testing.T) {
	d := soakDuration(t)
	c := testConfig(t)
	const tenants, perTenant = 4, 2
	soakKeys(&c, tenants)
	c.Serve.TrustedProxies = []string{"127.0.0.1/32"}
	c.Serve.MaxConnectionsPerClient = 16
	c.Serve.ReadHeaderTimeout, c.Serve.ReadTimeout = 2*time.Second, 3*time.Second
	addr := serveOn(t, newServer(t, c))
	lb := startHAProxy(t, addr)

	stop := make(chan struct{})
	var tcpOut, httpOut sync.Map
	const attacker = "127.0.2.1"
	tcpAttack := attack(attacker, lb.tcp, "GET /v1/models HTTP/1.1\r\nHo", 48, stop, &tcpOut)
	httpAttack := attack(attacker, lb.http, "POST /v1/memories HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-soak-0\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{", 48, stop, &httpOut)

	var checks, failed atomic.Int64
	var failures sync.Map
	health := sync.WaitGroup{}
	health.Go(func() {
		hc := clientFrom(attacker, false)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			for _, u := range []string{"http://" + lb.tcp + "/healthz", "http://" + lb.tcp + "/readyz", "http://" + lb.http + "/healthz", "http://" + lb.http + "/readyz"} {
				checks.Add(1)
				resp, err := hc.Get(u)
				if err != nil {
					failed.Add(1)
					failures.Store(u, err.Error())
					continue
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					failed.Add(1)
					failures.Store(u, fmt.Sprintf("%d %s", resp.StatusCode, body))
				}
			}
		}
	})

	time.Sleep(500 * time.Millisecond) // the attackers at their cap first
	st := newStats()
	clients := map[int]*http.Client{}
	start := time.Now()
	soakRun(tenants, perTenant, d, st, func(i int) (*http.Client, string) {
		cl := clientFrom(fmt.Sprintf("127.0.1.%d", i+1), true)
		clients[i] = cl
		if i%2 == 0 {
			return cl, "http://" + lb.http
		}
		return cl, "http://" + lb.tcp
	})
	elapsed := time.Since(start)
	close(stop)
	tcpAttack.Wait()
	httpAttack.Wait()
	health.Wait()
	for _, cl := range clients {
		cl.CloseIdleConnections()
	}

	var codes []string
	for k, v := range st.byStatus {
		codes = append(codes, fmt.Sprintf("%s: %d", k, v))
	}
	sort.Strings(codes)
	tcpCounts, tcpSummary := tally(&tcpOut)
	httpCounts, httpSummary := tally(&httpOut)
	t.Logf("behind haproxy, %s: %d honest requests (%.0f/s), statuses %s; PROXY-protocol attacker: %s; X-Forwarded-For attacker: %s; %d health checks from the attacker's address, %d failed",
		elapsed.Round(time.Second), st.requests.Load(), float64(st.requests.Load())/elapsed.Seconds(), strings.Join(codes, ", "),
		tcpSummary, httpSummary, checks.Load(), failed.Load())
	if len(st.fiveXX) > 0 {
		t.Fatalf("honest clients got 5xx or failed requests: %v", st.fiveXX)
	}
	if st.byStatus["200"] == 0 {
		t.Fatal("no honest request succeeded")
	}
	if failed.Load() > 0 || checks.Load() < 10 {
		var fs []string
		failures.Range(func(k, v any) bool { fs = append(fs, fmt.Sprintf("%s: %s", k, v)); return true })
		t.Fatalf("%d of %d health checks failed: %v", failed.Load(), checks.Load(), fs)
	}
	if tcpCounts["503 max_connections_per_client"] == 0 || httpCounts["503 max_connections_per_client"] == 0 {
		t.Fatalf("the attackers never met their per-client cap: PROXY protocol %s; X-Forwarded-For %s", tcpSummary, httpSummary)
	}
	// A stalled connection ends with the JSON 503 at once, with 408 at
	// serve.read_header_timeout or read_timeout, or closed when the
	// attacker stops.
	for k := range tcpCounts {
		if k != "503 max_connections_per_client" && k != "408 header_timeout" && k != "closed" {
			t.Fatalf("a stalled connection through the PROXY-protocol frontend ended with %s", k)
		}
	}
	for k := range httpCounts {
		if k != "503 max_connections_per_client" && k != "408 body_timeout" && k != "closed" {
			t.Fatalf("a stalled request through the HTTP frontend ended with %s", k)
		}
	}
}
