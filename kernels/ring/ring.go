// Package ring all-reduces float32 buffers between processes over TCP, as
// a ring (the reduce-scatter then all-gather of Baidu's ring all-reduce,
// which NCCL runs between GPUs): each of N ranks sends and receives
// 2(N−1)/N of the buffer whatever N is, so a rank's link, not the rank
// count, bounds the time. It is the kernels.Reducer of data-parallel ranks
// without GPUs, so multi-process training runs, and is tested, on CPUs.
//
// The sum is deterministic: chunk c is added up in the order of the ring
// starting at rank c, (g[c] + g[c+1]) + … + g[c−1], whatever the timing. With two ranks that is g[0] + g[1] for every chunk (IEEE
// addition commutes), the order kernels.HostReduce adds two replicas in,
// so two ranks reach the weights of one process with two replicas bit for
// bit; with more ranks the order differs from the host's by rounding.
package ring

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
	"unsafe"

	"github.com/agemem/agemem/kernels"
)

// magic opens a connection: the protocol, then the run's id and the
// dialling rank, so a stray or stale peer is refused by name.
const magic = "agemem-ring/1"

// segment is the most bytes written or read in one piece: sends and
// receives of a step overlap piece by piece.
const segment = 1 << 20

// Ring is this rank's two connections: to the next rank (it sends there)
// and from the previous one (it receives from there).
type Ring struct {
	rank, size int
	peers      []string // every rank's data address, for error messages
	next, prev net.Conn
	rd         *bufio.Reader
	timeout    time.Duration
	mu         sync.Mutex // one collective at a time
	closeOnce  sync.Once
	failed     error
	scratch    []byte
}

// Options shape a ring.
type Options struct {
	Rank int
	// Addrs are every rank's data address (host:port), rank order; this
	// rank listens on Addrs[Rank] through Listener.
	Addrs    []string
	Listener net.Listener
	// RunID is the run's rendezvous id: a connection from another run is
	// refused.
	RunID string
	// Timeout bounds connecting and each send or receive of a collective:
	// a peer silent for longer is taken for dead and named in the error.
	Timeout time.Duration
}

// Dial connects the ring: rank r dials rank r+1 and accepts rank r−1. One
// rank alone makes a ring whose collectives return at once. ctx ending
// closes the ring, failing a collective in progress.
func Dial(ctx context.Context, o Options) (*Ring, error) {
	n := len(o.Addrs)
	if o.Rank < 0 || o.Rank >= n {
		return nil, fmt.Errorf("ring: rank %d of %d", o.Rank, n)
	}
	if o.Timeout <= 0 {
		return nil, fmt.Errorf("ring: timeout %v must be positive", o.Timeout)
	}
	r := &Ring{rank: o.Rank, size: n, peers: o.Addrs, timeout: o.Timeout}
	if n == 1 {
		return r, nil
	}
	nextRank, prevRank := (o.Rank+1)%n, (o.Rank+n-1)%n
	type accepted struct {
		c   net.Conn
		err error
	}
	acc := make(chan accepted, 1)
	go func() {
		for {
			c, err := o.Listener.Accept()
			if err != nil {
				acc <- accepted{nil, fmt.Errorf("ring: rank %d accepting rank %d on %s: %w", o.Rank, prevRank, o.Addrs[o.Rank], err)}
				return
			}
			c.SetDeadline(time.Now().Add(o.Timeout))
			if err := readHello(c, o.RunID, prevRank); err != nil {
				// Not our predecessor (a port scan, another run): drop it and
				// keep waiting.
				c.Close()
				continue
			}
			c.SetDeadline(time.Time{})
			acc <- accepted{c, nil}
			return
		}
	}()
	deadline := time.Now().Add(o.Timeout)
	var next net.Conn
	for {
		d := net.Dialer{Deadline: deadline}
		c, err := d.DialContext(ctx, "tcp", o.Addrs[nextRank])
		if err == nil {
			next = c
			break
		}
		// The next rank may not listen yet: retry until the timeout.
		if ctx.Err() != nil || time.Now().After(deadline) {
			o.Listener.Close()
			return nil, fmt.Errorf("ring: rank %d cannot reach rank %d at %s within %v: %w", o.Rank, nextRank, o.Addrs[nextRank], o.Timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if tc, ok := next.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	next.SetDeadline(deadline)
	if err := writeHello(next, o.RunID, o.Rank); err != nil {
		next.Close()
		o.Listener.Close()
		return nil, fmt.Errorf("ring: rank %d greeting rank %d at %s: %w", o.Rank, nextRank, o.Addrs[nextRank], err)
	}
	next.SetDeadline(time.Time{})
	var a accepted
	select {
	case a = <-acc:
	case <-time.After(time.Until(deadline) + time.Second):
		a.err = fmt.Errorf("ring: rank %d: rank %d did not connect within %v", o.Rank, prevRank, o.Timeout)
	case <-ctx.Done():
		a.err = ctx.Err()
	}
	o.Listener.Close()
	if a.err != nil {
		next.Close()
		return nil, a.err
	}
	r.next, r.prev = next, a.c
	r.rd = bufio.NewReaderSize(a.c, segment)
	go func() {
		<-ctx.Done()
		r.fail(fmt.Errorf("ring: rank %d: %w", r.rank, context.Cause(ctx)))
	}()
	return r, nil
}

func writeHello(c net.Conn, run string, rank int) error {
	b := []byte(magic)
	b = binary.AppendUvarint(b, uint64(len(run)))
	b = append(b, run...)
	b = binary.AppendUvarint(b, uint64(rank))
	_, err := c.Write(b)
	return err
}

func readHello(c net.Conn, run string, want int) error {
	// Unbuffered, a byte at a time: the first collective's data may follow
	// the hello at once, and must stay in the connection.
	rd := byteReader{c}
	m := make([]byte, len(magic))
	if _, err := io.ReadFull(rd, m); err != nil || string(m) != magic {
		return fmt.Errorf("not a ring peer")
	}
	n, err := binary.ReadUvarint(rd)
	if err != nil || n > 256 {
		return fmt.Errorf("bad run id")
	}
	id := make([]byte, n)
	if _, err := io.ReadFull(rd, id); err != nil || string(id) != run {
		return fmt.Errorf("another run's peer")
	}
	rank, err := binary.ReadUvarint(rd)
	if err != nil || int(rank) != want {
		return fmt.Errorf("rank %d, want %d", rank, want)
	}
	return nil
}

type byteReader struct{ io.Reader }

func (b byteReader) ReadByte() (byte, error) {
	var one [1]byte
	_, err := io.ReadFull(b.Reader, one[:])
	return one[0], err
}

// Rank and Size are this rank's place and the ring's length.
func (r *Ring) Rank() int { return r.rank }
func (r *Ring) Size() int { return r.size }

// Close closes the ring's connections; collectives fail afterwards.
func (r *Ring) Close() error {
	r.fail(errors.New("ring closed"))
	return nil
}

func (r *Ring) fail(err error) {
	r.closeOnce.Do(func() {
		r.failed = err
		if r.next != nil {
			r.next.Close()
			r.prev.Close()
		}
	})
}

// Name implements kernels.Reducer.
func (r *Ring) Name() string { return fmt.Sprintf("a TCP ring of %d ranks", r.size) }

// AllReduce implements kernels.Reducer for this rank's one replica (bes
// and grads of length 1): every gradient is summed across the ranks, all
// of them in one pass of the ring.
func (r *Ring) AllReduce(bes []kernels.TrainBackend, grads [][]kernels.Tensor) error {
	if len(bes) != 1 || len(grads) != 1 {
		return fmt.Errorf("ring: %d replicas on rank %d: a rank trains one", len(bes), r.rank)
	}
	if r.size == 1 {
		return nil
	}
	be := bes[0]
	var flat []float32
	for _, g := range grads[0] {
		flat = append(flat, be.ToHost(g)...)
	}
	if err := r.SumFloat32(flat); err != nil {
		return err
	}
	at := 0
	for _, g := range grads[0] {
		n := g.Len()
		be.CopyRows(g, 0, be.FromHost(flat[at:at+n], g.Shape()...), 0, g.Shape()[0])
		at += n
	}
	return nil
}

// SumFloat32 replaces buf on every rank by the element-wise sum of every
// rank's buf; all ranks pass buffers of one length.
func (r *Ring) SumFloat32(buf []float32) error {
	if r.size == 1 || len(buf) == 0 {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failed != nil {
		return r.failed
	}
	n := r.size
	// Chunk c is buf[bounds[c]:bounds[c+1]]; chunks differ by at most one
	// value, and a chunk may be empty when buf is shorter than the ring.
	bounds := make([]int, n+1)
	for c := 0; c <= n; c++ {
		bounds[c] = c * len(buf) / n
	}
	chunk := func(c int) []float32 {
		c = ((c % n) + n) % n
		return buf[bounds[c]:bounds[c+1]]
	}
	if r.scratch == nil {
		r.scratch = make([]byte, segment)
	}
	// Reduce-scatter: at step s rank r sends chunk r−s and adds what it
	// receives into chunk r−s−1; after N−1 steps it holds the sum of
	// chunk r+1.
	for s := 0; s < n-1; s++ {
		if err := r.exchange(chunk(r.rank-s), chunk(r.rank-s-1), true); err != nil {
			return err
		}
	}
	// All-gather: the summed chunks go once more round the ring.
	for s := 0; s < n-1; s++ {
		if err := r.exchange(chunk(r.rank+1-s), chunk(r.rank-s), false); err != nil {
			return err
		}
	}
	return nil
}

// exchange sends out to the next rank while it receives into in from the
// previous one, adding (reduce) or copying.
func (r *Ring) exchange(out, in []float32, add bool) error {
	errc := make(chan error, 1)
	go func() {
		b := bytesOf(out)
		for len(b) > 0 {
			k := min(len(b), segment)
			r.next.SetWriteDeadline(time.Now().Add(r.timeout))
			if _, err := r.next.Write(b[:k]); err != nil {
				errc <- r.peerError("sending to", (r.rank+1)%r.size, err)
				return
			}
			b = b[k:]
		}
		errc <- nil
	}()
	var rerr error
	for at := 0; at < len(in) && rerr == nil; {
		k := min(len(in)-at, segment/4)
		raw := r.scratch[:4*k]
		r.prev.SetReadDeadline(time.Now().Add(r.timeout))
		if _, err := io.ReadFull(r.rd, raw); err != nil {
			rerr = r.peerError("receiving from", (r.rank+r.size-1)%r.size, err)
			break
		}
		got := floatsOf(raw)
		dst := in[at : at+k]
		if add {
			for i, v := range got {
				dst[i] = v + dst[i]
			}
		} else {
			copy(dst, got)
		}
		at += k
	}
	if rerr != nil {
		r.fail(rerr)
		<-errc
		return rerr
	}
	if err := <-errc; err != nil {
		r.fail(err)
		return err
	}
	return nil
}

// peerError names the peer a collective lost, and why: closed (it died),
// silent past the timeout (it hangs), or the ring was closed here.
func (r *Ring) peerError(what string, peer int, err error) error {
	if r.failed != nil {
		return r.failed
	}
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("ring: rank %d %s rank %d (%s): nothing for %v, the rank hangs or its host is unreachable", r.rank, what, peer, r.peers[peer], r.timeout)
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed):
		return fmt.Errorf("ring: rank %d %s rank %d (%s): the connection closed, the rank exited", r.rank, what, peer, r.peers[peer])
	}
	return fmt.Errorf("ring: rank %d %s rank %d (%s): %w", r.rank, what, peer, r.peers[peer], err)
}

// bytesOf and floatsOf view float32s as their bytes in memory order: the
// wire format is little-endian, the order of every platform Go's purego
// GPU path runs on (amd64, arm64); init refuses another.
func bytesOf(f []float32) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), 4*len(f))
}

func floatsOf(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

func init() {
	x := uint16(1)
	if *(*byte)(unsafe.Pointer(&x)) != 1 {
		panic("kernels/ring: a big-endian machine; the ring's wire format is little-endian")
	}
}
