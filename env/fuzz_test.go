package env

import (
	"bytes"
	"testing"
)

// FuzzStreamHotpot: a task file of any bytes is read with an error or as
// tasks whose every supporting fact is in their context. `make test` runs
// the seeds; `make fuzz` explores.
func FuzzStreamHotpot(f *testing.F) {
	f.Add([]byte(`[{"_id":"a","question":"q?","answer":"x","type":"bridge","level":"easy","context":[["T",["s0.","s1."]],["U",["u."]]],"supporting_facts":[["T",1],["T",7]]}]`))
	f.Add([]byte(`[{"_id":"a","question":"q","answer":"a","context":[["t",["s"]]],"supporting_facts":[["t",-1]]}]`))
	f.Add([]byte(`[{"_id":"a","context":[["t",[1]]],"supporting_facts":[["u",0]]}]`))
	f.Add([]byte(`[{}, 3]`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		StreamHotpot(bytes.NewReader(raw), func(task Task) error {
			for _, s := range task.SupportingFacts {
				found := false
				for _, c := range task.Context {
					found = found || c == s
				}
				if !found {
					t.Fatalf("task %q: supporting fact %q is not in its context", task.ID, s)
				}
			}
			return nil
		})
	})
}
