package memtoolagent

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/agemem/agemem/bench/nestful"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/model/chat"
)

// scripted answers each query from a table and records the system
// prompts it was given.
type scripted struct {
	mu      sync.Mutex
	answers map[string]string
	systems map[string]string
}

func (m *scripted) Chat(_ context.Context, req llm.Request) (llm.Response, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	q := req.Messages[len(req.Messages)-1].Content
	if req.Messages[0].Role == "system" && strings.HasPrefix(req.Messages[0].Content, "You are an agent responsible for analyzing") {
		return llm.Response{Message: chat.Message{Role: "assistant", Content: "it added where it should have multiplied"}}, nil
	}
	m.systems[q] = req.Messages[0].Content
	return llm.Response{Message: chat.Message{Role: "assistant", Content: m.answers[q]}, PromptTokens: 100}, nil
}

// TestBenchWithAndWithoutMemory: a scripted model right on some samples,
// wrong or unparsable on others; the means are worked by hand, and with
// memory the test prompts carry the memory samples' entries, a failure's
// with the extractor's critique.
func TestBenchWithAndWithoutMemory(t *testing.T) {
	needPython(t)
	ex, err := nestful.NewExecutor(toyFunctions(t), "")
	if err != nil {
		t.Fatal(err)
	}
	base := nestful.ToySample()
	gold, _ := json.Marshal(base.Output)
	short := `[{"name": "rectangle_area", "label": "$var_1", "arguments": {"arg_0": 20, "arg_1": 10}}]`
	mk := func(id, q string) nestful.Sample { s := base; s.ID, s.Input = id, q; return s }
	test := []nestful.Sample{mk("t1", "rhombus one"), mk("t2", "rhombus two"), mk("t3", "rhombus three")}
	memory := []nestful.Sample{mk("m1", "rhombus memory right"), mk("m2", "rhombus memory wrong")}
	m := &scripted{systems: map[string]string{}, answers: map[string]string{
		"rhombus one": string(gold), "rhombus two": short, "rhombus three": "12.5",
		"rhombus memory right": string(gold), "rhombus memory wrong": short,
	}}
	off, err := Nestful(context.Background(), test, memory, NestfulOptions{Model: m, Exec: ex, Parallel: 2})
	if err != nil {
		t.Fatal(err)
	}
	// t1 full; t2 one call of three (partial 1/3, executes to 200, not
	// 12.5); t3 unparsed (0). Names over the corpus: rectangle_area F1
	// 4/5, multiply and divide 1/2 each: macro 0.6.
	if off.Full.Mean != 1.0/3 || off.Win.Mean != 1.0/3 || off.Win.N != 3 || off.Unparsed != 1 ||
		math.Abs(off.F1Function-0.6) > 1e-12 || math.Abs(off.Partial.Mean-4.0/9) > 1e-12 {
		t.Fatalf("without memory: %+v", off)
	}
	if strings.Contains(m.systems["rhombus one"], "Example Query") {
		t.Fatal("a prompt without memory shows memory entries")
	}
	mem := &Memory{Store: ltm.NewMemStore(1), Embedder: embed.NewHashing(256, nil), Count: TopK(2)}
	on, err := Nestful(context.Background(), test, memory, NestfulOptions{Model: m, Exec: ex, Memory: mem})
	if err != nil {
		t.Fatal(err)
	}
	if on.MemorySize != 2 || on.Runs[0].Recalled != 2 || on.Full.Mean != off.Full.Mean {
		t.Fatalf("with memory: %+v", on)
	}
	p := m.systems["rhombus one"]
	for _, want := range []string{"Example Query: rhombus memory right", "Reflection/Critic: correct tool calls", "=====",
		"Example Query: rhombus memory wrong", "Reflection/Critic: it added where it should have multiplied", `"name":"rectangle_area"`} {
		if !strings.Contains(p, want) {
			t.Fatalf("the prompt with memory lacks %q:\n%s", want, p)
		}
	}
}

type failing struct{}

func (failing) Chat(context.Context, llm.Request) (llm.Response, error) {
	return llm.Response{}, errors.New("prompt of 3524 tokens exceeds the limit of 2048")
}

// TestBenchScoresAModelErrorAsAFailure: a sample the model gives no
// answer for is a scored failure with its reason, not the run's end; a
// cancelled run ends.
func TestBenchScoresAModelErrorAsAFailure(t *testing.T) {
	s := nestful.ToySample()
	r, err := Nestful(context.Background(), []nestful.Sample{s, s}, nil, NestfulOptions{Model: failing{}})
	if err != nil || r.Errors != 2 || r.Full.Mean != 0 || r.Full.N != 2 || !strings.Contains(r.Runs[1].Error, "exceeds the limit") {
		t.Fatalf("%+v, %v", r, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Nestful(ctx, []nestful.Sample{s}, nil, NestfulOptions{Model: failing{}}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled run: %v", err)
	}
}

// TestPromptShowsTheToolsAsWritten: Figure 18's prompt carries each tool
// as the data wrote it (every key, in order, "<" not escaped), and a
// recalled failure with its critique.
func TestPromptShowsTheToolsAsWritten(t *testing.T) {
	tool := `{"name": "f", "description": "a < b", "parameters": {"x": {"type": "int"}}, "output_parameters": {"result": {}}, "extra": 1}`
	s := toySampleWith(t, tool)
	p := NestfulPrompt(s, nil)
	if !strings.Contains(p, `[{"name":"f","description":"a < b","parameters":{"x":{"type":"int"}},"output_parameters":{"result":{}},"extra":1}]`) || strings.Contains(p, "Example Query") {
		t.Fatalf("%s", p)
	}
	p = NestfulPrompt(s, []Entry{{Query: "q", Actions: []string{`{"name":"f"}`}, Feedback: 0, Reflection: "wrong x"}})
	if !strings.Contains(p, "Example Query: q\nTool Calls Used: [{\"name\":\"f\"}]\nReflection/Critic: wrong x\n") {
		t.Fatalf("%s", p)
	}
}

func needPython(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3: the win rate runs NESTFUL's Python functions")
	}
}

func toyFunctions(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := nestful.WriteToyFunctions(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// toySampleWith is the toy sample whose only tool is tool (JSON).
func toySampleWith(t *testing.T, tool string) nestful.Sample {
	t.Helper()
	s := nestful.ToySample()
	var x nestful.Tool
	if err := json.Unmarshal([]byte(tool), &x); err != nil {
		t.Fatal(err)
	}
	s.Tools = []nestful.Tool{x}
	return s
}
