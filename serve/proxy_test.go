package serve

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agemem/agemem/memtools/ltm"
)

func v2Header(cmd byte, fam byte, addrs []byte) []byte {
	h := append([]byte(nil), proxyV2Sig...)
	h = append(h, 0x20|cmd, fam, 0, 0)
	binary.BigEndian.PutUint16(h[14:], uint16(len(addrs)))
	return append(h, addrs...)
}

// TestReadProxyHeader reads PROXY headers as HAProxy and nginx write
// them, refuses malformed ones, and leaves a request that has none
// untouched.
func TestReadProxyHeader(t *testing.T) {
	v4 := []byte{192, 0, 2, 7, 10, 0, 0, 1, 0x12, 0x34, 0, 80}
	v6 := append(append(netip.MustParseAddr("2001:db8::7").AsSlice(), netip.MustParseAddr("2001:db8::1").AsSlice()...), 0xab, 0xcd, 0, 80)
	for _, c := range []struct {
		name, in, want string // want: the client, "-" for none named, "error", or "no header"
	}{
		{"v1 TCP4", "PROXY TCP4 192.0.2.7 10.0.0.1 56324 443\r\nGET / HTTP/1.1\r\n", "192.0.2.7:56324"},
		{"v1 TCP6", "PROXY TCP6 2001:db8::7 2001:db8::1 4711 80\r\nGET /", "[2001:db8::7]:4711"},
		{"v1 UNKNOWN", "PROXY UNKNOWN\r\nGET /", "-"},
		{"v1 UNKNOWN with addresses", "PROXY UNKNOWN ffff:f...f:ffff 1.2.3.4 65535 65535\r\nGET /", "-"},
		{"v1 without CRLF", "PROXY TCP4 192.0.2.7 10.0.0.1 1 2\nGET /", "error"},
		{"v1 too long", "PROXY TCP4 " + strings.Repeat("1", 120) + "\r\n", "error"},
		{"v1 IPv6 under TCP4", "PROXY TCP4 2001:db8::7 10.0.0.1 1 2\r\n", "error"},
		{"v1 port out of range", "PROXY TCP4 192.0.2.7 10.0.0.1 65536 2\r\n", "error"},
		{"v1 port with a leading zero", "PROXY TCP4 192.0.2.7 10.0.0.1 080 2\r\n", "error"},
		{"v1 a field missing", "PROXY TCP4 192.0.2.7 10.0.0.1 80\r\n", "error"},
		{"v2 TCP over IPv4", string(v2Header(1, 0x11, v4)) + "GET /", "192.0.2.7:4660"},
		{"v2 TCP over IPv6", string(v2Header(1, 0x21, v6)) + "GET /", "[2001:db8::7]:43981"},
		{"v2 with TLVs", string(v2Header(1, 0x11, append(v4, 0x04, 0, 2, 'h', 'i'))) + "GET /", "192.0.2.7:4660"},
		{"v2 LOCAL (a health check)", string(v2Header(0, 0x00, nil)), "-"},
		{"v2 short addresses", string(v2Header(1, 0x11, v4[:6])), "error"},
		{"v2 version 1", strings.Replace(string(v2Header(1, 0x11, v4)), "\x21", "\x11", 1), "error"},
		{"an HTTP request", "POST /v1/memories HTTP/1.1\r\n", "no header"},
		{"PUT, starting with P", "PUT /x HTTP/1.1\r\n", "no header"},
	} {
		br := bufio.NewReader(strings.NewReader(c.in))
		ap, err := readProxyHeader(br)
		got := "-"
		switch {
		case err == errNoProxyHeader:
			got = "no header"
			if rest, _ := io.ReadAll(br); string(rest) != c.in {
				t.Errorf("%s: a request without a header was consumed", c.name)
			}
		case err != nil:
			got = "error"
		case ap.IsValid():
			got = ap.String()
		}
		if got != c.want {
			t.Errorf("%s: %s (%v), want %s", c.name, got, err, c.want)
		}
	}
}

// TestForwardedClient takes the client from X-Forwarded-For only as far
// as trusted proxies vouch for it.
func TestForwardedClient(t *testing.T) {
	trusted, err := parseProxies([]string{"127.0.0.1/32", "10.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	peer := netip.MustParseAddr("127.0.0.1")
	for _, c := range []struct {
		name   string
		values []string
		want   string
	}{
		{"one proxy", []string{"198.51.100.7"}, "198.51.100.7"},
		{"a client's own claim left of the real address", []string{"6.6.6.6, 198.51.100.7"}, "198.51.100.7"},
		{"two trusted proxies", []string{"198.51.100.7, 10.1.2.3"}, "198.51.100.7"},
		{"two headers", []string{"198.51.100.7", "10.1.2.3"}, "198.51.100.7"},
		{"with a port", []string{"198.51.100.7:4711"}, "198.51.100.7"},
		{"IPv6 with a port", []string{"[2001:db8::7]:4711"}, "2001:db8::7"},
		{"garbage", []string{"not-an-address"}, "127.0.0.1"},
		{"garbage left of the real address", []string{"x, 198.51.100.7"}, "198.51.100.7"},
		{"none", nil, "127.0.0.1"},
		{"only trusted", []string{"10.0.0.9"}, "10.0.0.9"},
	} {
		if got := forwardedClient(c.values, peer, trusted); got.String() != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
	if _, err := parseProxies([]string{"10.0.0.0/8", "nonsense"}); err == nil || !strings.Contains(err.Error(), "trusted_proxies[1]") {
		t.Errorf("a bad entry: %v", err)
	}
	c := testConfig(t)
	c.Serve.TrustedProxies = []string{"10.0.0.0/33"}
	if err := c.Serve.Validate(); err == nil || !strings.Contains(err.Error(), "trusted_proxies") {
		t.Errorf("validate: %v", err)
	}
}

// logBuffer collects a server's log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Behind a trusted proxy (here the test writes what HAProxy and nginx
// write), each client the proxy names is held to its own share: a client
// at its cap of connections (PROXY protocol) or of requests in flight
// (X-Forwarded-For) gets the JSON 503, another client and every health
// check through the same proxy are served, the log names the real client,
// and neither header is believed from anyone else.
func TestTrustedProxyCapsEachClient(t *testing.T) {
	c := testConfig(t)
	c.Serve.MaxConnectionsPerClient = 4
	c.Serve.ReadHeaderTimeout, c.Serve.ReadTimeout = 5*time.Second, 5*time.Second
	c.Serve.TrustedProxies = []string{"127.0.0.1/32"}
	logs := &logBuffer{}
	db, err := ltm.OpenSQLite(c.Memory.Path, ltm.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	s, err := New(with(c.options(), func(o *Options) {
		o.Backend, o.Store, o.Logger = newScripted(), db, slog.New(slog.NewJSONHandler(logs, nil))
	}))
	if err != nil {
		t.Fatal(err)
	}
	addr := serveOn(t, s)
	proxied := func(client, raw string) net.Conn {
		t.Helper()
		conn := dialFrom(t, "127.0.0.1", addr)
		fmt.Fprintf(conn, "PROXY TCP4 %s 127.0.0.1 40000 80\r\n%s", client, raw)
		return conn
	}
	get := func(path string) string {
		return fmt.Sprintf("GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", path, aliceKey)
	}
	status := func(conn net.Conn) (int, string) {
		t.Helper()
		defer conn.Close()
		conn.SetReadDeadline(time.Now().Add(3 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("no response: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}

	// PROXY protocol: 203.0.113.1 holds its 4 connections, stalled.
	var held []net.Conn
	for range 4 {
		held = append(held, proxied("203.0.113.1", "GET /v1/models HTTP/1.1\r\nHo"))
	}
	time.Sleep(100 * time.Millisecond)
	if code, body := status(proxied("203.0.113.1", get("/v1/models"))); code != 503 || !strings.Contains(body, "max_connections_per_client") {
		t.Fatalf("a fifth connection of the client: %d %s", code, body)
	}
	if code, body := status(proxied("203.0.113.1", "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")); code != 200 || !strings.Contains(body, "ok") {
		t.Fatalf("a health check of the client at its cap: %d %s", code, body)
	}
	if code, body := status(proxied("203.0.113.2", get("/v1/models"))); code != 200 {
		t.Fatalf("another client through the same proxy: %d %s", code, body)
	}
	if !strings.Contains(logs.String(), `"remote":"203.0.113.2:40000"`) {
		t.Fatalf("the log does not name the client:\n%s", logs)
	}

	// X-Forwarded-For: 203.0.113.3 holds 4 requests in flight (bodies
	// that have not arrived).
	for range 4 {
		conn := dialFrom(t, "127.0.0.1", addr)
		fmt.Fprintf(conn, "POST /v1/memories HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 203.0.113.3\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{", aliceKey)
		held = append(held, conn)
	}
	time.Sleep(200 * time.Millisecond)
	post := func(client string) reply {
		return do(t, "POST", "http://"+addr+"/v1/memories", aliceKey, `{"content":"x"}`, "X-Forwarded-For", client, "Content-Type", "application/json")
	}
	if r := post("203.0.113.3"); r.Status != 503 || r.errorCode(t) != "max_connections_per_client" {
		t.Fatalf("a fifth request in flight of the client: %d %s", r.Status, r.Body)
	}
	if r := do(t, "GET", "http://"+addr+"/readyz", "", nil, "X-Forwarded-For", "203.0.113.3"); r.Status != 200 {
		t.Fatalf("readiness for the client at its cap: %d %s", r.Status, r.Body)
	}
	if r := post("203.0.113.4"); r.Status != 201 {
		t.Fatalf("another client through the same proxy: %d %s", r.Status, r.Body)
	}

	// From an address that is not trusted, neither header is believed:
	// X-Forwarded-For does not move the client, a PROXY line is a bad
	// request.
	for range 4 {
		conn := dialFrom(t, "127.0.0.2", addr)
		fmt.Fprintf(conn, "GET /v1/models HTTP/1.1\r\nHo")
		held = append(held, conn)
	}
	time.Sleep(100 * time.Millisecond)
	spoof := dialFrom(t, "127.0.0.2", addr)
	fmt.Fprintf(spoof, "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 198.51.100.1\r\nAuthorization: Bearer %s\r\n\r\n", aliceKey)
	if code, body := status(spoof); code != 503 {
		t.Fatalf("X-Forwarded-For from an untrusted peer at its cap: %d %s", code, body)
	}
	for _, conn := range held {
		conn.Close()
	}
	time.Sleep(100 * time.Millisecond)
	line := dialFrom(t, "127.0.0.2", addr)
	fmt.Fprintf(line, "PROXY TCP4 198.51.100.1 127.0.0.1 1 2\r\n%s", get("/v1/models"))
	if code, body := status(line); code != 400 {
		t.Fatalf("a PROXY line from an untrusted peer: %d %s", code, body)
	}
}

// A connection refused over the per-client cap gets the JSON 503 while
// its client is still sending (before: the server answered and closed at
// once with the request unread, so the rest of the request met a TCP
// reset, and the client lost the answer), and a health check over the cap
// is answered as usual.
func TestRefusedConnectionsGetTheJSON503(t *testing.T) {
	c := testConfig(t)
	c.Serve.MaxConnectionsPerClient = 2
	addr := serveOn(t, newServer(t, c))
	for range 2 {
		conn := dialFrom(t, "127.0.0.2", addr)
		defer conn.Close()
		fmt.Fprint(conn, "GET /healthz HTTP/1.1\r\nHo")
	}
	time.Sleep(100 * time.Millisecond)
	body := `{"content":"` + strings.Repeat("x", 8000) + `"}`
	var wg sync.WaitGroup
	results := make([]string, 40)
	for i := range results {
		wg.Go(func() {
			conn := dialFrom(t, "127.0.0.2", addr)
			defer conn.Close()
			// The headers, then the body a moment later, as a client
			// sends a request it has not finished composing.
			fmt.Fprintf(conn, "POST /v1/memories HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", aliceKey, len(body))
			time.Sleep(150 * time.Millisecond)
			if _, err := io.WriteString(conn, body); err != nil {
				results[i] = "sending the body: " + err.Error()
				return
			}
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				results[i] = err.Error()
				return
			}
			raw, _ := io.ReadAll(resp.Body)
			results[i] = fmt.Sprintf("%d %s", resp.StatusCode, raw)
		})
	}
	wg.Wait()
	for i, r := range results {
		if !strings.HasPrefix(r, "503 ") || !strings.Contains(r, `"code":"max_connections_per_client"`) {
			t.Fatalf("refused connection %d: %s", i, r)
		}
	}
	hc := dialFrom(t, "127.0.0.2", addr)
	rawJSON := rawRequestOn(t, hc, "GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
	if rawJSON.Status != 200 {
		t.Fatalf("readiness over the cap: %d %s", rawJSON.Status, rawJSON.Body)
	}
}

func rawRequestOn(t *testing.T, conn net.Conn, raw string) reply {
	t.Helper()
	defer conn.Close()
	io.WriteString(conn, raw)
	conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no response: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, body}
}
