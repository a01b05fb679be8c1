package kernels

// Reducer sums gradients across replicas in place: after AllReduce,
// grads[r][j] on every replica r holds Σ_r grads[r][j].
type Reducer interface {
	AllReduce(bes []TrainBackend, grads [][]Tensor) error
	Name() string
}

// HostReduce all-reduces through host memory, adding replicas in order
// (so the sum does not depend on timing). It works for any backend,
// simulated CPU devices included.
type HostReduce struct{}

// Name implements Reducer.
func (HostReduce) Name() string { return "host memory" }

// AllReduce implements Reducer.
func (HostReduce) AllReduce(bes []TrainBackend, grads [][]Tensor) error {
	if len(bes) < 2 {
		return nil
	}
	for j := range grads[0] {
		sum := bes[0].ToHost(grads[0][j])
		for r := 1; r < len(bes); r++ {
			for i, v := range bes[r].ToHost(grads[r][j]) {
				sum[i] += v
			}
		}
		for r, be := range bes {
			g := grads[r][j]
			rows := g.Shape()[0]
			be.CopyRows(g, 0, be.FromHost(sum, g.Shape()...), 0, rows)
		}
	}
	return nil
}
