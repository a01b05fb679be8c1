package env

import (
	"bytes"
	"strings"
	"testing"
)

func TestReasoningHandWorked(t *testing.T) {
	cases := []struct {
		task Task
		seen string // the context: the facts' order in it is the restatement's
		want string // "" when there is no reasoning
	}{
		{Task{Type: "comparison", Question: "Who was born first, Braizeas Nystax or Gerox Hyki?", Answer: "Braizeas Nystax",
			SupportingFacts: []string{"Gerox Hyki is a sculptor born in 1994.", "Braizeas Nystax is a novelist born in 1841."}}, "",
			"1841: Braizeas Nystax. 1994: Gerox Hyki. The earlier is 1841: Braizeas Nystax."},
		{Task{Type: "comparison", Question: "Which was founded earlier, Zubrim Industries or Demar Labs?", Answer: "Demar Labs",
			SupportingFacts: []string{"Zubrim Industries is a textile firm founded in 1994.", "Demar Labs is a glassmaking firm founded in 1852."}}, "",
			"1994: Zubrim Industries. 1852: Demar Labs. The earlier is 1852: Demar Labs."},
		// The same century and decade: only the last digit decides.
		{Task{Type: "comparison", Question: "Who was born first, Ana Bel or Ana Belo?", Answer: "Ana Belo",
			SupportingFacts: []string{"Ana Bel is a poet born in 1907.", "Ana Belo is a poet born in 1903."}}, "",
			"1907: Ana Bel. 1903: Ana Belo. The earlier is 1903: Ana Belo."},
		{Task{Type: "comparison", Question: "Are Sabaholm and Bawysburg in the same country?", Answer: "no",
			SupportingFacts: []string{"Bawysburg is a town in Sytilia.", "Sabaholm is a town in Sifyrovia."}}, "",
			"Sabaholm: Sifyrovia. Bawysburg: Sytilia. Different countries."},
		{Task{Type: "comparison", Question: "Are Quuvaholm and Dawumere in the same country?", Answer: "yes",
			SupportingFacts: []string{"Quuvaholm is a town in Piquisovia.", "Dawumere is a town in Piquisovia."}}, "",
			"Quuvaholm: Piquisovia. Dawumere: Piquisovia. The same country."},
		// Restated in the order the context holds the facts (their last
		// occurrence: the retrieval result), the verdict unchanged.
		{Task{Type: "comparison", Question: "Which was founded earlier, Zubrim Industries or Demar Labs?", Answer: "Demar Labs",
			SupportingFacts: []string{"Zubrim Industries is a textile firm founded in 1994.", "Demar Labs is a glassmaking firm founded in 1852."}},
			"Zubrim Industries is a textile firm founded in 1994. | Demar Labs is a glassmaking firm founded in 1852. Zubrim Industries is a textile firm founded in 1994.",
			"1852: Demar Labs. 1994: Zubrim Industries. The earlier is 1852: Demar Labs."},
		{Task{Type: "comparison", Question: "Are Sabaholm and Bawysburg in the same country?", Answer: "no",
			SupportingFacts: []string{"Bawysburg is a town in Sytilia.", "Sabaholm is a town in Sifyrovia."}},
			"Bawysburg is a town in Sytilia. Sabaholm is a town in Sifyrovia.",
			"Bawysburg: Sytilia. Sabaholm: Sifyrovia. Different countries."},
		// One fact missing from the context: the question's order.
		{Task{Type: "comparison", Question: "Are Sabaholm and Bawysburg in the same country?", Answer: "no",
			SupportingFacts: []string{"Bawysburg is a town in Sytilia.", "Sabaholm is a town in Sifyrovia."}},
			"Bawysburg is a town in Sytilia.",
			"Sabaholm: Sifyrovia. Bawysburg: Sytilia. Different countries."},
		// Bridge questions keep the plain thought.
		{Task{Type: "bridge", Question: "In which country was Gerox Hyki born?", Answer: "Sytilia",
			SupportingFacts: []string{"Gerox Hyki was born in Bawysburg.", "Bawysburg is a town in Sytilia."}}, "", ""},
		// A fact it cannot read (no year), or about another name: none.
		{Task{Type: "comparison", Question: "Who was born first, Ana Bel or Ana Belo?", Answer: "Ana Bel",
			SupportingFacts: []string{"Ana Bel is a poet born in Weaxmere.", "Ana Belo is a poet born in 1903."}}, "", ""},
		{Task{Type: "comparison", Question: "Who was born first, Ana Bel or Ana Belo?", Answer: "Ana Bel",
			SupportingFacts: []string{"Ana Belon is a poet born in 1901.", "Ana Belo is a poet born in 1903."}}, "", ""},
	}
	for _, c := range cases {
		got, ok := Reasoning(c.task, c.seen)
		if ok != (c.want != "") || got != c.want {
			t.Errorf("%q: got %q (%v), want %q", c.task.Question, got, ok, c.want)
		}
	}
}

// Every comparison the generator makes is reasoned, and the reasoning's
// verdict is the gold answer.
func TestOracleReasonsOnEveryGeneratedComparison(t *testing.T) {
	var buf bytes.Buffer
	WriteHotpot(&buf, NewSynth(11).Generate(120))
	n := 0
	StreamHotpot(&buf, func(task Task) error {
		r, ok := Reasoning(task, "")
		if task.Type != "comparison" {
			return nil
		}
		n++
		if !ok {
			t.Fatalf("%s: no reasoning for %q", task.ID, task.Question)
		}
		switch {
		case task.Answer == "yes" && !strings.HasSuffix(r, "The same country."),
			task.Answer == "no" && !strings.HasSuffix(r, "Different countries."),
			task.Answer != "yes" && task.Answer != "no" && !strings.HasSuffix(r, ": "+task.Answer+"."):
			t.Fatalf("%s: reasoning %q disagrees with the answer %q", task.ID, r, task.Answer)
		}
		return nil
	})
	if n < 40 {
		t.Fatalf("only %d comparisons", n)
	}
}

// The reasoning oracle thinks a comparison out from the facts it retrieved,
// in the order they came back, and guesses without them; the plain oracle
// (make base's teacher) only says it can answer.
func TestOracleReasonsOnlyFromFactsItSees(t *testing.T) {
	var buf bytes.Buffer
	WriteHotpot(&buf, NewSynth(12).Generate(40))
	reasoned := 0
	StreamHotpot(&buf, func(task Task) error {
		if task.Type != "comparison" {
			return nil
		}
		last := func(r Result) (string, string) {
			return r.Final[len(r.Final)-2].Content, r.Final[len(r.Final)-1].Content
		}
		retrieved, got := last(runEpisode(t, NewOracle(task, 0, 0, 1).ReasoningAloud(true), task))
		want, ok := Reasoning(task, retrieved)
		if !ok || !strings.Contains(got, "<think>"+want+"</think>\n<answer>"+task.Answer+"</answer>") {
			t.Fatalf("%s: the oracle that stored both facts answered %q", task.ID, got)
		}
		reasoned++
		if _, got := last(runEpisode(t, NewOracle(task, 0, 0, 1), task)); strings.Contains(got, want) {
			t.Fatalf("%s: the plain oracle reasoned: %q", task.ID, got)
		}
		// Storing nothing, it has no facts to reason from: it guesses.
		if _, got := last(runEpisode(t, NewOracle(task, 1, 0, 1).ReasoningAloud(true), task)); strings.Contains(got, want) || !strings.Contains(got, "only guess") {
			t.Fatalf("%s: the oracle that stored nothing answered %q", task.ID, got)
		}
		return nil
	})
	if reasoned < 10 {
		t.Fatalf("only %d comparisons reasoned", reasoned)
	}
}
