package serve

import (
	"net/http"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/agemem/agemem/console/browsertest"
)

// hostile is a memory a model or a user could write to break a page.
const hostile = `<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"><b>bold?</b>`

// TestConsoleInChromium drives the console in Chromium as a person would:
// log in with a key (typed into the form: the URL never holds it), see a
// memory the API added, search it, edit and delete it on the pages and
// find the API agreeing; a memory holding HTML and script shows as text
// and runs nothing; a conversation's turns show the tool calls and link
// the memories they wrote; the health page shows the live figures; a
// tenant's key reaches neither another namespace's pages nor its forms.
func TestConsoleInChromium(t *testing.T) {
	b := browsertest.Start(t)
	ts := start(t, testConfig(t), newScripted())
	api := func(method, path, key string, body any) reply { return do(t, method, ts.URL+path, key, body) }
	for _, m := range []map[string]any{
		{"content": "Alice works as a nurse in Lyon", "memory_type": "fact", "metadata": map[string]any{"topic": "work"}},
		{"content": "Alice prefers green tea in the morning", "memory_type": "preference", "metadata": map[string]any{"topic": "food"}},
	} {
		if r := api("POST", "/v1/memories", aliceKey, m); r.Status != http.StatusCreated {
			t.Fatalf("add: %d %s", r.Status, r.Body)
		}
	}
	id := addViaAPI(t, ts, aliceKey, "Alice's cat is called Miso")
	hid := addViaAPI(t, ts, aliceKey, hostile)
	answer(t, ts, aliceKey, "trip-planning", "Remember: Alice's sister lives in Porto")
	answer(t, ts, aliceKey, "trip-planning", "Recall: Alice's sister lives")
	answer(t, ts, aliceKey, "", "Hello there")
	pwned := func(where string) {
		t.Helper()
		if browsertest.Get(b, chromedp.Evaluate[bool](`window.__pwned !== undefined`, chromedp.EvalAsValue)) {
			t.Fatalf("%s: a memory's script ran", where)
		}
	}

	// Log in.
	b.Do(chromedp.Navigate(ts.URL+"/ui/"), chromedp.WaitVisible(chromedp.CSS(`input[name=key]`)))
	b.Screenshot("console-login")
	b.Follow(chromedp.SendKeys(chromedp.CSS(`input[name=key]`), aliceKey), chromedp.Submit(chromedp.CSS(`input[name=key]`)))
	if loc := b.Location(); !strings.Contains(loc, "/ui/memories") || strings.Contains(loc, aliceKey) {
		t.Fatalf("after login the tab is at %s", loc)
	}
	list := b.Text("table.memories")
	if !strings.Contains(list, "Alice's cat is called Miso") || !strings.Contains(b.Text("main h2"), "5 memories") {
		t.Fatalf("the list lacks the API's memory:\n%s", list)
	}
	if !strings.Contains(list, `<script>window.__pwned = 1</script>`) {
		t.Fatalf("the hostile memory is not shown as its text:\n%s", list)
	}
	pwned("the list")
	b.Screenshot("console-memories")

	// Search.
	b.Follow(chromedp.SendKeys(chromedp.CSS(`input[name=q]`), "what is the cat called"), chromedp.Submit(chromedp.CSS(`input[name=q]`)))
	first := b.Text("table.memories tbody tr")
	if !strings.Contains(first, "Miso") || !strings.Contains(first, "0.") {
		t.Fatalf("the best hit of the search is %q, want the cat's memory with its score", first)
	}
	b.Screenshot("console-search")

	// Edit on the memory's page; the API reads the edit.
	b.Follow(chromedp.Click(chromedp.CSS(`table.memories a[href^="/ui/memories/` + id + `"]`)))
	b.Follow(chromedp.SetValue(chromedp.CSS(`textarea[name=content]`), "Alice's cat is called Mochi"),
		chromedp.SetValue(chromedp.CSS(`textarea[name=metadata]`), `{"pet": "cat"}`),
		chromedp.Click(chromedp.CSS(`form.card button[type=submit]`)))
	if n := b.Text(".notice"); n != "Memory updated." {
		t.Fatalf("after the edit the page says %q", n)
	}
	got := api("GET", "/v1/memories/"+id, aliceKey, nil).json(t)
	if got["content"] != "Alice's cat is called Mochi" || got["metadata"].(map[string]any)["pet"] != "cat" {
		t.Fatalf("the API reads %v after the page's edit", got)
	}
	b.Screenshot("console-memory")

	// Delete, through the confirmation page.
	b.Follow(chromedp.Click(chromedp.CSS(`a.danger`)))
	b.Screenshot("console-delete")
	b.Follow(chromedp.Click(chromedp.CSS(`button.danger`)))
	if n := b.Text(".notice"); n != "Memory deleted." {
		t.Fatalf("after the delete the page says %q", n)
	}
	if r := api("GET", "/v1/memories/"+id, aliceKey, nil); r.Status != http.StatusNotFound {
		t.Fatalf("the API still reads the deleted memory: %d", r.Status)
	}

	// The hostile memory's own page: its text, nothing run.
	b.Do(chromedp.Navigate(ts.URL+"/ui/memories/"+hid), chromedp.WaitVisible(chromedp.CSS("#content")))
	if c := b.Text("#content"); c != hostile {
		t.Fatalf("the memory's page shows %q, want its text %q", c, hostile)
	}
	pwned("the memory's page")

	// A conversation: the turns, the tool calls, the memory they wrote.
	b.Do(chromedp.Navigate(ts.URL+"/ui/conversations"), chromedp.WaitVisible(chromedp.CSS("main table")))
	if convs := b.Text("main table"); !strings.Contains(convs, "trip-planning") || !strings.Contains(convs, "Hello there") {
		t.Fatalf("the conversations:\n%s", convs)
	}
	b.Follow(chromedp.Click(chromedp.CSS(`a[href^="/ui/conversations/trip-planning"]`)))
	turns := b.Text("main")
	for _, want := range []string{"Add_memory", "Retrieve_memory", "Alice's sister lives in Porto", "prompt"} {
		if !strings.Contains(turns, want) {
			t.Fatalf("the conversation page lacks %q:\n%s", want, turns)
		}
	}
	b.Screenshot("console-conversation")
	b.Follow(chromedp.Click(chromedp.CSS(`.mems a`)))
	if c := b.Text("#content"); c != "Alice's sister lives in Porto" {
		t.Fatalf("the memory a turn wrote links to %q", c)
	}

	b.Do(chromedp.Navigate(ts.URL+"/ui/health"), chromedp.WaitVisible(chromedp.CSS("table.figures")))
	if h := b.Text("table.figures"); !strings.Contains(h, "chat completions") || !strings.Contains(h, "queue") || !strings.Contains(h, "KV blocks") {
		t.Fatalf("the health page:\n%s", h)
	}
	b.Screenshot("console-health")
	b.Settle()
	if p := b.Problems(); len(p) > 0 {
		t.Fatalf("the pages reported errors:\n%s", strings.Join(p, "\n"))
	}

	// Another tenant: bob reaches neither alice's pages nor her forms.
	aliceHas := len(api("GET", "/v1/memories", aliceKey, nil).json(t)["data"].([]any))
	b.Follow(chromedp.Click(chromedp.CSS(`form[action="/ui/logout"] button`)))
	b.Follow(chromedp.SendKeys(chromedp.CSS(`input[name=key]`), bobKey), chromedp.Submit(chromedp.CSS(`input[name=key]`)))
	if list := b.Text("main"); strings.Contains(list, "Alice") {
		t.Fatalf("bob's list shows alice's memories:\n%s", list)
	}
	for _, page := range []string{"/ui/memories?namespace=alice", "/ui/memories/" + hid + "?namespace=alice", "/ui/conversations?namespace=alice",
		"/ui/conversations/trip-planning?namespace=alice"} {
		b.Do(chromedp.Navigate(ts.URL+page), chromedp.WaitVisible(chromedp.CSS("p.error")))
		if msg := b.Text("p.error"); !strings.Contains(msg, "may not see namespace alice") {
			t.Fatalf("bob at %s reads %q", page, msg)
		}
	}
	b.Do(chromedp.Navigate(ts.URL+"/ui/conversations/trip-planning"), chromedp.WaitVisible(chromedp.CSS("p.error")))
	// bob's own form, pointed at alice's namespace.
	b.Do(chromedp.Navigate(ts.URL + "/ui/memories"))
	b.Follow(chromedp.SetValue(chromedp.CSS(`form[action="/ui/memories"][method=post] input[name=namespace]`), "alice"),
		chromedp.SetValue(chromedp.CSS(`textarea[name=content]`), "planted by bob"),
		chromedp.Submit(chromedp.CSS(`textarea[name=content]`)))
	if msg := b.Text("p.error"); !strings.Contains(msg, "may not see namespace alice") {
		t.Fatalf("bob's form sent to alice's namespace: %q", msg)
	}
	if n := len(api("GET", "/v1/memories", aliceKey, nil).json(t)["data"].([]any)); n != aliceHas {
		t.Fatalf("alice holds %d memories after bob's forged form, had %d", n, aliceHas)
	}

	// An admin chooses the namespace.
	b.Follow(chromedp.Click(chromedp.CSS(`form[action="/ui/logout"] button`)))
	b.Follow(chromedp.SendKeys(chromedp.CSS(`input[name=key]`), adminKey), chromedp.Submit(chromedp.CSS(`input[name=key]`)))
	b.Follow(chromedp.SetValue(chromedp.CSS(`select[name=namespace]`), "alice"), chromedp.Submit(chromedp.CSS(`select[name=namespace]`)))
	if list := b.Text("table.memories"); !strings.Contains(list, "Alice works as a nurse in Lyon") {
		t.Fatalf("the admin's view of alice:\n%s", list)
	}
	b.Screenshot("console-admin")
}
