package cuda

import (
	"fmt"
	"io"
	"sort"
	"sync"
	"time"

	"github.com/ebitengine/purego"
)

// Profiling without a profiler: between StartProfile and StopProfile every
// kernel launch and cuBLAS GEMM is bracketed by a pair of CUDA events on
// the backend's stream, and StopProfile sums each kernel's device time.
// Nsight is not on every machine that has a GPU (nor is a display for it),
// and a training step's thousands of launches are exactly what per-kernel
// replay profilers are slowest at.

// eventLib holds the driver's event entry points, bound on first use so
// that a driver without one of them disables profiling, not the backend.
type eventLib struct {
	create  func(ev *uintptr, flags uint32) cuResult
	record  func(ev, stream uintptr) cuResult
	sync    func(ev uintptr) cuResult
	elapsed func(ms *float32, start, end uintptr) cuResult
	destroy func(ev uintptr) cuResult
	err     error
}

var (
	eventsOnce sync.Once
	events     eventLib
)

func loadEvents() error {
	eventsOnce.Do(func() {
		lib, _, err := open([]string{"libcuda.so.1", "libcuda.so"})
		if err != nil {
			events.err = err
			return
		}
		// CUDA 12.8 added cuEventElapsedTime_v2; older drivers have only
		// the first, and cuEventDestroy became _v2 long ago.
		for _, f := range []struct {
			fn    any
			names []string
		}{
			{&events.create, []string{"cuEventCreate"}},
			{&events.record, []string{"cuEventRecord"}},
			{&events.sync, []string{"cuEventSynchronize"}},
			{&events.elapsed, []string{"cuEventElapsedTime_v2", "cuEventElapsedTime"}},
			{&events.destroy, []string{"cuEventDestroy_v2", "cuEventDestroy"}},
		} {
			var addr uintptr
			for _, n := range f.names {
				if a, err := purego.Dlsym(lib, n); err == nil {
					addr = a
					break
				}
			}
			if addr == 0 {
				events.err = fmt.Errorf("the CUDA driver has none of %v: no profiling", f.names)
				return
			}
			purego.RegisterFunc(f.fn, addr)
		}
	})
	return events.err
}

var noop = func() {}

type profMark struct {
	name       string
	start, end uintptr
}

type profiler struct {
	mu    sync.Mutex
	marks []profMark
}

func newEvent() uintptr {
	var ev uintptr
	must(events.create(&ev, 0).err("cuEventCreate"))
	return ev
}

// ProfileRow is one kernel's (or GEMM kind's) share of a profile.
type ProfileRow struct {
	Name  string
	Calls int
	Time  time.Duration
}

// Profile is the device time of what ran between StartProfile and
// StopProfile, by kernel, largest first.
type Profile struct {
	Rows  []ProfileRow
	Total time.Duration
}

// StartProfile starts timing every launch and GEMM on this backend.
func (b *Backend) StartProfile() error {
	if err := loadEvents(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.prof == nil {
		b.prof = &profiler{}
	}
	return nil
}

// mark records a start event for name and returns what records its end;
// a no-op when not profiling.
func (b *Backend) mark(name string) func() {
	b.mu.Lock()
	p := b.prof
	b.mu.Unlock()
	if p == nil {
		return noop
	}
	m := profMark{name: name, start: newEvent(), end: newEvent()}
	must(events.record(m.start, b.stream).err("cuEventRecord"))
	return func() {
		must(events.record(m.end, b.stream).err("cuEventRecord"))
		p.mu.Lock()
		p.marks = append(p.marks, m)
		p.mu.Unlock()
	}
}

// StopProfile waits for the timed work and returns its device time by
// kernel.
func (b *Backend) StopProfile() (Profile, error) {
	defer b.enter()()
	b.mu.Lock()
	p := b.prof
	b.prof = nil
	b.mu.Unlock()
	var out Profile
	if p == nil {
		return out, fmt.Errorf("cuda: StopProfile without StartProfile")
	}
	by := map[string]*ProfileRow{}
	for _, m := range p.marks {
		if r := events.sync(m.end); r != 0 {
			return out, r.err("cuEventSynchronize")
		}
		var ms float32
		if r := events.elapsed(&ms, m.start, m.end); r != 0 {
			return out, r.err("cuEventElapsedTime")
		}
		row := by[m.name]
		if row == nil {
			row = &ProfileRow{Name: m.name}
			by[m.name] = row
		}
		d := time.Duration(float64(ms) * float64(time.Millisecond))
		row.Calls++
		row.Time += d
		out.Total += d
	}
	for _, m := range p.marks {
		events.destroy(m.start)
		events.destroy(m.end)
	}
	for _, r := range by {
		out.Rows = append(out.Rows, *r)
	}
	sort.Slice(out.Rows, func(i, j int) bool { return out.Rows[i].Time > out.Rows[j].Time })
	return out, nil
}

// Write prints the profile's first n rows (all when n <= 0): time, share,
// calls, mean time a call.
func (p Profile) Write(w io.Writer, n int) {
	fmt.Fprintf(w, "%-28s %10s %6s %8s %10s\n", "kernel", "ms", "share", "calls", "us/call")
	for i, r := range p.Rows {
		if n > 0 && i == n {
			break
		}
		share := 0.0
		if p.Total > 0 {
			share = float64(r.Time) / float64(p.Total)
		}
		fmt.Fprintf(w, "%-28s %10.1f %5.1f%% %8d %10.1f\n", r.Name, float64(r.Time)/1e6, 100*share, r.Calls, float64(r.Time)/1e3/float64(r.Calls))
	}
	fmt.Fprintf(w, "%-28s %10.1f\n", "total (device time)", float64(p.Total)/1e6)
}
