package serve

// Client identity behind a load balancer. A connection from an address in
// serve.trusted_proxies is the proxy's, not a client's: the client is the
// one the proxy names, in a PROXY protocol header that opens the
// connection (HAProxy's send-proxy and send-proxy-v2, nginx's
// proxy_protocol; https://www.haproxy.org/download/2.6/doc/proxy-protocol.txt)
// or, for a proxy speaking HTTP, in each request's X-Forwarded-For. Only a
// trusted proxy is believed: from anyone else a PROXY line is a bad
// request and X-Forwarded-For is ignored.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// proxies are the trusted proxies' networks.
type proxies []netip.Prefix

// parseProxies reads serve.trusted_proxies: CIDRs, or single addresses.
func parseProxies(list []string) (proxies, error) {
	var out proxies
	for i, s := range list {
		s = strings.TrimSpace(s)
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("serve.trusted_proxies[%d]: %q is not a CIDR (10.0.0.0/8) or an address", i, s)
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}

func (p proxies) trusts(a netip.Addr) bool {
	a = a.Unmap()
	for _, n := range p {
		if n.Contains(a) {
			return true
		}
	}
	return false
}

// addrOf is the IP of a connection's address.
func addrOf(a net.Addr) netip.Addr {
	if t, ok := a.(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(t.IP)
		return ip.Unmap()
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// forwardedClient is the client a request through trusted proxies comes
// from: the X-Forwarded-For entries are read from the right (the address
// the nearest proxy saw) past every trusted proxy; the first address not
// trusted is the client. A proxy appends, so what a client wrote itself
// lies to the left of what the proxies vouch for, and is believed only as
// far as the chain of trusted proxies reaches.
func forwardedClient(values []string, peer netip.Addr, trusted proxies) netip.Addr {
	var entries []string
	for _, v := range values {
		entries = append(entries, strings.Split(v, ",")...)
	}
	client := peer
	for i := len(entries) - 1; i >= 0; i-- {
		a, ok := parseForwarded(strings.TrimSpace(entries[i]))
		if !ok {
			break // not an address: nothing left of it is vouched for
		}
		client = a
		if !trusted.trusts(a) {
			break
		}
	}
	return client
}

// parseForwarded reads one X-Forwarded-For entry: an address, optionally
// with a port ("192.0.2.1:4711", "[2001:db8::1]:4711").
func parseForwarded(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	if a, err := netip.ParseAddr(strings.Trim(s, "[]")); err == nil {
		return a.Unmap(), true
	}
	return netip.Addr{}, false
}

// proxyV2Sig opens a version 2 (binary) PROXY header.
var proxyV2Sig = []byte("\r\n\r\n\x00\r\nQUIT\n")

var errNoProxyHeader = errors.New("no PROXY header")

// readProxyHeader reads a PROXY protocol header, version 1 or 2, from br.
// It returns the client's address, or an invalid AddrPort for a header
// that names none (v1 UNKNOWN, v2 LOCAL: the proxy's own connections,
// such as its health checks); errNoProxyHeader when br does not start with
// one (nothing is consumed then).
func readProxyHeader(br *bufio.Reader) (netip.AddrPort, error) {
	first, err := br.Peek(1)
	if err != nil {
		return netip.AddrPort{}, err
	}
	switch first[0] {
	case 'P':
		if b, err := br.Peek(6); err != nil || string(b) != "PROXY " {
			return netip.AddrPort{}, errNoProxyHeader
		}
		return readProxyV1(br)
	case '\r':
		if b, err := br.Peek(len(proxyV2Sig)); err != nil || !bytes.Equal(b, proxyV2Sig) {
			return netip.AddrPort{}, errNoProxyHeader
		}
		return readProxyV2(br)
	}
	return netip.AddrPort{}, errNoProxyHeader
}

// readProxyV1 reads "PROXY TCP4|TCP6 src dst sport dport\r\n" or
// "PROXY UNKNOWN ...\r\n", 107 bytes at most.
func readProxyV1(br *bufio.Reader) (netip.AddrPort, error) {
	var line []byte
	for len(line) < 107 {
		b, err := br.ReadByte()
		if err != nil {
			return netip.AddrPort{}, err
		}
		line = append(line, b)
		if b == '\n' {
			break
		}
	}
	s, ok := strings.CutSuffix(string(line), "\r\n")
	if !ok {
		return netip.AddrPort{}, errors.New("a PROXY v1 header must end in CRLF within 107 bytes")
	}
	f := strings.Split(s, " ")
	if len(f) >= 2 && f[1] == "UNKNOWN" {
		return netip.AddrPort{}, nil
	}
	if len(f) != 6 || (f[1] != "TCP4" && f[1] != "TCP6") {
		return netip.AddrPort{}, fmt.Errorf("PROXY v1 header %q: want PROXY TCP4|TCP6 src dst sport dport", s)
	}
	src, err := netip.ParseAddr(f[2])
	if err != nil || src.Is4() != (f[1] == "TCP4") || src.Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("PROXY v1 header %q: source %q is not an %s address", s, f[2], map[bool]string{true: "IPv4", false: "IPv6"}[f[1] == "TCP4"])
	}
	if _, err := netip.ParseAddr(f[3]); err != nil {
		return netip.AddrPort{}, fmt.Errorf("PROXY v1 header %q: destination %q is not an address", s, f[3])
	}
	var ports [2]uint16
	for i, p := range f[4:] {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || (len(p) > 1 && p[0] == '0') {
			return netip.AddrPort{}, fmt.Errorf("PROXY v1 header %q: port %q", s, p)
		}
		ports[i] = uint16(n)
	}
	return netip.AddrPortFrom(src, ports[0]), nil
}

// readProxyV2 reads the binary header: the signature, version and command,
// family and protocol, the length of what follows, the addresses, TLVs.
func readProxyV2(br *bufio.Reader) (netip.AddrPort, error) {
	hdr := make([]byte, 16)
	if _, err := io.ReadFull(br, hdr); err != nil {
		return netip.AddrPort{}, err
	}
	if hdr[12]>>4 != 2 {
		return netip.AddrPort{}, fmt.Errorf("PROXY v2 header: version %d", hdr[12]>>4)
	}
	n := int(binary.BigEndian.Uint16(hdr[14:]))
	if n > 1500 {
		return netip.AddrPort{}, fmt.Errorf("PROXY v2 header: %d bytes of addresses and TLVs", n)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(br, body); err != nil {
		return netip.AddrPort{}, err
	}
	switch cmd := hdr[12] & 0xf; {
	case cmd == 0:
		return netip.AddrPort{}, nil // LOCAL: the proxy's own connection
	case cmd != 1:
		return netip.AddrPort{}, fmt.Errorf("PROXY v2 header: command %d", cmd)
	}
	switch hdr[13] {
	case 0x11, 0x12: // TCP or UDP over IPv4
		if n < 12 {
			return netip.AddrPort{}, errors.New("PROXY v2 header: short IPv4 addresses")
		}
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(body[:4])), binary.BigEndian.Uint16(body[8:])), nil
	case 0x21, 0x22: // over IPv6
		if n < 36 {
			return netip.AddrPort{}, errors.New("PROXY v2 header: short IPv6 addresses")
		}
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(body[:16])).Unmap(), binary.BigEndian.Uint16(body[32:])), nil
	}
	return netip.AddrPort{}, nil // UNSPEC or a unix socket: no client address
}
