package env

import (
	"context"
	"testing"

	"github.com/agemem/agemem/embed"
)

// SupportRecall counts supporting facts among the question's top k of its
// task's sentences.
func TestSupportRecall(t *testing.T) {
	task := Task{Question: "Where was Marla Quenby born?",
		SupportingFacts: []string{"Marla Quenby was born in Velden.", "Velden is a town in Norway."},
		Distractors:     []string{"The Asca flows through Brill. Brill has a market.", "Tomas Ek founded Ekco."}}
	h := embed.NewHashing(256, []int{3})
	r1, err := SupportRecall(context.Background(), h, []Task{task}, 1)
	if err != nil || r1 != 0.5 {
		t.Fatalf("recall@1 %v %v", r1, err)
	}
	r5, _ := SupportRecall(context.Background(), h, []Task{task}, 5)
	if r5 != 1 {
		t.Fatalf("recall@5 %v", r5)
	}
}
