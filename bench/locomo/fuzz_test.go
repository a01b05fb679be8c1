package locomo

import (
	"testing"
)

// FuzzParse: a LoCoMo file of any bytes parses with an error or as samples
// with unique ids. `make test` runs the seeds; `make fuzz` explores.
func FuzzParse(f *testing.F) {
	f.Add([]byte(`[{"sample_id":"s1","conversation":{"speaker_a":"A","speaker_b":"B","session_1_date_time":"1:56 pm on 8 May, 2023","session_1":[{"speaker":"A","dia_id":"D1:1","text":"hi"}]},"qa":[{"question":"q","answer":"a","evidence":["D1:1"],"category":1}]}]`))
	f.Add([]byte(`[{"sample_id":"s1","conversation":{"session_x":[]},"qa":[{"category":9}]}]`))
	f.Add([]byte(`[{"sample_id":"s1","conversation":{"session_1":[{"dia_id":3}]}}, {"sample_id":"s1"}]`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		samples, err := Parse(raw)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, s := range samples {
			if seen[s.ID] {
				t.Fatalf("sample id %q twice", s.ID)
			}
			seen[s.ID] = true
		}
	})
}
