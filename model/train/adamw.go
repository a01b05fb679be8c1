package train

import (
	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/model/optim"
)

// A replica's update: gradient clipping and AdamW on the device, and the
// trained parameters and moments copied back to the host.

// ZeroGrad clears the gradients.
func (d *Replica) ZeroGrad() {
	for _, p := range d.Params {
		if p.G != nil {
			d.be.Zero(p.G)
		}
	}
}

// Step clips the gradients to the global norm maxNorm (0: no clipping),
// takes AdamW step number stepN (1-based, for the bias corrections) at
// rate lr, and clears the gradients. The squared norm stays on the
// device; SumSq returns it for logging.
//
// owned, if not nil, limits the update to the parameters it marks (the
// replica's share under a sharded optimiser); the others' gradients are only
// cleared. The clipping norm is over every gradient either way.
func (d *Replica) Step(c optim.AdamWConfig, stepN int, lr, maxNorm float64, owned []bool) kernels.Tensor {
	ss := d.sumSquares(nil)
	d.apply(c, stepN, lr, maxNorm, owned, ss)
	return ss
}

// sumSquares is Σ g² over the gradients owned marks (nil: all), on the
// device.
func (d *Replica) sumSquares(owned []bool) kernels.Tensor {
	ss := d.be.Zeros(1)
	for j, p := range d.Params {
		if owned == nil || owned[j] {
			d.be.SumSquares(ss, p.G)
		}
	}
	return ss
}

// apply is Step's update given the squared global norm ss.
func (d *Replica) apply(c optim.AdamWConfig, stepN int, lr, maxNorm float64, owned []bool, ss kernels.Tensor) {
	be := d.be
	for j, p := range d.Params {
		if owned != nil && !owned[j] {
			if p.G != nil {
				be.Zero(p.G)
			}
			continue
		}
		w := p.master()
		if p.M == nil {
			p.M, p.V = be.Zeros(w.Shape()...), be.Zeros(w.Shape()...)
		}
		s := c.Step(stepN, lr, p.Decay)
		s.MaxNorm = maxNorm
		be.AdamW(w, p.G, p.M, p.V, ss, s)
		be.Zero(p.G)
	}
}

// Download copies the trainable parameters back into w (the host master
// copy that rollouts and checkpoints read) and, when opt is not nil, the
// moments into it.
func (d *Replica) Download(w *Weights[float32], opt *optim.AdamW) {
	for _, nv := range w.Trainable() {
		copy(nv.V.Val, d.be.ToHost(d.all[nv.Name].master()))
	}
	if opt != nil {
		d.DownloadMoments(opt)
	}
}

// DownloadMoments copies into opt the moments this replica holds (all of
// them, or its share under a sharded optimiser).
func (d *Replica) DownloadMoments(opt *optim.AdamW) {
	for _, p := range d.Params {
		if p.M != nil {
			opt.M[p.Name], opt.V[p.Name] = d.be.ToHost(p.M), d.be.ToHost(p.V)
		}
	}
}

// LoadMoments sets the AdamW moments the host optimiser holds (a resumed
// run's) for the parameters owned marks (nil: all); parameters without
// any start from zero at the first step.
func (d *Replica) LoadMoments(opt *optim.AdamW, owned []bool) {
	for j, p := range d.Params {
		if owned != nil && !owned[j] {
			continue
		}
		if m, v := opt.M[p.Name], opt.V[p.Name]; m != nil {
			p.M, p.V = d.be.FromHost(m, p.W.Shape()...), d.be.FromHost(v, p.W.Shape()...)
		}
	}
}
