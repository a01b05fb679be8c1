package stabletoolbench

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/agemem/agemem/agent"
)

// FuzzLoadCollection: a tool collection file of any bytes loads with an
// error or as tools whose names are unique and valid function names (what
// a chat API accepts). `make test` runs the seeds; `make fuzz` explores.
func FuzzLoadCollection(f *testing.F) {
	f.Add([]byte(`[{"name":"git","description":"Git","category":"dev","tools":{"git":{"tools":[{"name":"status","description":"show","inputSchema":{"type":"object","properties":{}}},{"name":"log"}]}}}]`))
	f.Add([]byte(`[{"name":"a b","tools":[{"name":"do it!"},{"name":"do-it"},{"name":"do_it"}]},{"name":"c","tools":[{"name":"do it!"}]}]`))
	f.Add([]byte(`[{"name":"x","tools":[{"name":"tool_with_a_name_that_is_longer_than_sixty_four_characters_in_all_of_it"},{"name":"tool_with_a_name_that_is_longer_than_sixty_four_characters_in_all_of_it"}]}]`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		path := filepath.Join(t.TempDir(), "tools.json")
		os.WriteFile(path, raw, 0o644)
		tools, err := LoadCollection(path)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, tl := range tools {
			if !agent.ValidName.MatchString(tl.Name) || seen[tl.Name] {
				t.Fatalf("tool name %q (valid %v, repeated %v)", tl.Name, agent.ValidName.MatchString(tl.Name), seen[tl.Name])
			}
			seen[tl.Name] = true
		}
	})
}
