package train

import (
	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/half"
	"github.com/agemem/agemem/model/qwen"
)

// hostLayers are a frozen model's layer parameters in host memory, as the
// devices would hold them, by layer; replicas on several devices share one.
type hostLayers [][]hostParam

type hostParam struct {
	name string
	w    kernels.Weight // a matrix (bf16 bits under a bf16 base)
	vec  []float32      // or a vector (a norm's weight, a bias) of w's shape
}

// newHostLayers keeps w's layer parameters for uploading as NewReplica
// would hold them: frozen matrices rounded to bf16 once when the base is
// held so, the rest as they are.
func newHostLayers(w *Weights[float32], base Base) hostLayers {
	h := make(hostLayers, w.Config.Layers)
	layerOf := map[string]int{}
	for _, p := range qwen.Params(w.Config) {
		layerOf[p.Name] = p.Layer
	}
	for _, nv := range w.Named {
		l, ok := layerOf[nv.Name]
		if !ok || l < 0 {
			continue
		}
		v := nv.V
		hp := hostParam{name: nv.Name}
		switch {
		case v.Rows <= 1 || v.Cols <= 1:
			hp.vec, hp.w = v.Val, kernels.Weight{Rows: v.Rows, Cols: v.Cols}
		case base == BaseF32 || v.Requires:
			hp.w = kernels.Weight{Rows: v.Rows, Cols: v.Cols, F32: v.Val}
		default:
			bits := make([]uint16, len(v.Val))
			for i, x := range v.Val {
				bits[i] = half.F32ToBF16(x)
			}
			hp.w = kernels.Weight{Rows: v.Rows, Cols: v.Cols, BF16: bits}
		}
		h[l] = append(h[l], hp)
	}
	return h
}

// load uploads layer li's parameters to d's device; drop lets them go.
func (h hostLayers) load(d *Replica, li int) {
	for _, hp := range h[li] {
		p := d.all[hp.name]
		if hp.vec != nil {
			p.W = d.be.FromHost(hp.vec, hp.w.Rows, hp.w.Cols)
		} else {
			p.W = d.be.Upload(hp.w)
		}
	}
}

func (h hostLayers) drop(d *Replica, li int) {
	for _, hp := range h[li] {
		d.all[hp.name].W = nil
	}
}
