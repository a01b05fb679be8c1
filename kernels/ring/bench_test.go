package ring

import (
	"io"
	"net"
	"testing"
	"time"
)

// BenchmarkSum all-reduces a 64 MiB gradient between 2 and 4 ranks over
// loopback TCP and reports, beside it, loopback's raw bandwidth measured in
// the same run (one connection streaming the bytes a rank sends): the
// ring's bus bandwidth (NCCL's busbw, 2(N−1)/N of the buffer per rank over
// the time) over the raw figure is the share of the link the ring uses.
func BenchmarkSum(b *testing.B) {
	const values = 16 << 20 // 64 MiB of float32
	for _, n := range []int{2, 4} {
		b.Run(map[int]string{2: "ranks=2", 4: "ranks=4"}[n], func(b *testing.B) {
			rs := rings(b, n, time.Minute)
			bufs := make([][]float32, n)
			for i := range bufs {
				bufs[i] = make([]float32, values)
			}
			sent := int64(2 * (n - 1) * values * 4 / n)
			raw := loopbackBandwidth(b, sent)
			b.SetBytes(values * 4)
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				for _, err := range sumAll(rs, bufs) {
					if err != nil {
						b.Fatal(err)
					}
				}
			}
			per := time.Since(start).Seconds() / float64(b.N)
			bus := float64(sent) / per / 1e6
			b.ReportMetric(bus, "busMB/s")
			b.ReportMetric(raw/1e6, "loopbackMB/s")
			b.ReportMetric(bus/(raw/1e6), "bus/loopback")
		})
	}
}

// loopbackBandwidth streams n bytes over one loopback TCP connection and
// returns bytes per second.
func loopbackBandwidth(b *testing.B, n int64) float64 {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err == nil {
			io.Copy(io.Discard, c)
			c.Close()
		}
		close(done)
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, segment)
	start := time.Now()
	for left := n; left > 0; left -= int64(len(buf)) {
		if _, err := c.Write(buf[:min(int64(len(buf)), left)]); err != nil {
			b.Fatal(err)
		}
	}
	c.Close()
	<-done
	return float64(n) / time.Since(start).Seconds()
}
