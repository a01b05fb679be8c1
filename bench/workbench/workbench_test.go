package workbench

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func call(t *testing.T, s *Sandbox, name string, a Args) any {
	t.Helper()
	out, err := s.Call(name, a)
	if err != nil {
		t.Fatalf("%s %v: %v", name, a, err)
	}
	return out
}

// TestGoldAnswersScoreCorrect: every shipped task's gold actions, run in
// the sandbox, change it and score correct against themselves (exact
// match, no wrong side effects); doing nothing, or deleting the wrong
// thing, does not score correct, and the wrong deletion is a side effect.
func TestGoldAnswersScoreCorrect(t *testing.T) {
	d := Default()
	n := 0
	for _, f := range []string{"analytics", "calendar", "email"} {
		tasks, err := LoadTasks(filepath.Join("data", f+"_queries_and_answers.csv"))
		if err != nil {
			t.Fatal(err)
		}
		for _, task := range tasks {
			if len(task.Answer) == 0 {
				continue
			}
			n++
			for _, a := range task.Answer {
				if _, err := ParseAction(a); err != nil {
					t.Fatalf("%q: %v", a, err)
				}
			}
			if s := d.Grade(task.Answer, task.Answer, false); !s.Correct || !s.ExactMatch || s.SideEffects {
				t.Fatalf("%q: gold against itself %+v", task.Query, s)
			}
			if s := d.Grade(nil, task.Answer, false); s.Correct || s.SideEffects {
				t.Fatalf("%q: nothing done scored %+v", task.Query, s)
			}
			if s := d.Grade(task.Answer, task.Answer, true); s.Correct {
				t.Fatalf("%q: a failed run scored correct", task.Query)
			}
		}
	}
	if n < 250 {
		t.Fatalf("only %d tasks with actions", n)
	}
	wrong := d.Grade([]string{`calendar.delete_event.func(event_id="00000013")`}, []string{`calendar.delete_event.func(event_id="00000256")`}, false)
	if wrong.Correct || wrong.ExactMatch || !wrong.SideEffects {
		t.Fatalf("deleting the wrong event: %+v", wrong)
	}
	// Case does not matter, except in status, list_name and board.
	gold := []string{`calendar.update_event.func(event_id="00000256", field="event_name", new_value="Sync Up")`}
	if !d.Grade([]string{`calendar.update_event.func(event_id="00000256", field="event_name", new_value="sync up")`}, gold, false).Correct {
		t.Fatal("an event name differing in case scored wrong")
	}
	gold = []string{`project_management.update_task.func(task_id="00000149", field="list_name", new_value="In Review")`}
	if d.Grade([]string{`project_management.update_task.func(task_id="00000149", field="list_name", new_value="in review")`}, gold, false).Correct {
		t.Fatal("a list name is case sensitive (and that value is not a valid list)")
	}
}

// TestCalendarTools: creation lower-cases the participant and takes the
// next zero-padded ID; deletion and updates; messages for what is missing,
// in the order the tools check.
func TestCalendarTools(t *testing.T) {
	s := Default().New()
	if got := call(t, s, "calendar.create_event", Args{"event_name": "Lunch", "participant_email": "Sam@Atlas.com", "event_start": "2023-12-01 12:00:00"}); got != "Event duration not provided." {
		t.Fatalf("missing duration: %v", got)
	}
	if got := call(t, s, "calendar.create_event", Args{"participant_email": "x"}); got != "Event name not provided." {
		t.Fatalf("missing name first: %v", got)
	}
	id := call(t, s, "calendar.create_event", Args{"event_name": "Lunch", "participant_email": "Sam@Atlas.com", "event_start": "2023-12-01 12:00:00", "duration": "30"})
	if id != "00000300" {
		t.Fatalf("new event id %v", id)
	}
	last := s.calendar.rows[len(s.calendar.rows)-1]
	if last.label != 0 || s.calendar.get(last, "participant_email").s != "sam@atlas.com" {
		t.Fatalf("new row %+v", last) // pd.concat keeps the one-row frame's label 0
	}
	if got := call(t, s, "calendar.get_event_information_by_id", Args{"event_id": "00000300", "field": "duration"}); !reflect.DeepEqual(got, map[string]any{"duration": "30"}) {
		t.Fatalf("lookup %v", got)
	}
	if got := call(t, s, "calendar.get_event_information_by_id", Args{"event_id": "00000300", "field": "colour"}); got != "Field not found." {
		t.Fatalf("bad field %v", got)
	}
	if got := call(t, s, "calendar.update_event", Args{"event_id": "00000300", "field": "participant_email", "new_value": "ANA@atlas.com"}); got != "Event updated successfully." ||
		s.calendar.get(s.calendar.rows[len(s.calendar.rows)-1], "participant_email").s != "ana@atlas.com" {
		t.Fatalf("update %v", got)
	}
	if got := call(t, s, "calendar.delete_event", Args{"event_id": "99999999"}); got != "Event not found." {
		t.Fatal(got)
	}
	if got := call(t, s, "calendar.delete_event", Args{"event_id": "00000300"}); got != "Event deleted successfully." || len(s.calendar.rows) != 300 {
		t.Fatalf("%v, %d rows", got, len(s.calendar.rows))
	}
	// Search: a case-insensitive regular expression over name and
	// participant, start times within bounds, at most five.
	got := call(t, s, "calendar.search_events", Args{"query": "SYNC up", "time_min": "2023-08-01 00:00:00", "time_max": "2023-08-31 23:59:59"})
	evs, ok := got.([]map[string]any)
	if !ok || len(evs) == 0 || len(evs) > 5 {
		t.Fatalf("search %v", got)
	}
	for _, e := range evs {
		if !strings.Contains(strings.ToLower(e["event_name"].(string)), "sync up") || !strings.HasPrefix(e["event_start"].(string), "2023-08") {
			t.Fatalf("search hit %v", e)
		}
	}
	if _, err := s.Call("calendar.search_events", Args{"query": "("}); err == nil {
		t.Fatal("a bad regular expression must raise, as pandas does")
	}
	if _, err := s.Call("calendar.delete_event", Args{"id": "1"}); err == nil || !strings.Contains(err.Error(), "unexpected keyword argument 'id'") {
		t.Fatalf("unknown argument: %v", err)
	}
}

// TestEmailTools: sending takes str(int(max) + 1) unpadded and the fixed
// current time; forwarding prefixes "FW: "; and sending after a deletion
// overwrites the row at label len(EMAILS), as WorkBench's pandas code does.
func TestEmailTools(t *testing.T) {
	d := Default()
	s := d.New()
	if got := call(t, s, "email.send_email", Args{"recipient": "bad-address", "subject": "s", "body": "b"}); got != "Invalid recipient email address." {
		t.Fatal(got)
	}
	call(t, s, "email.send_email", Args{"recipient": "Nadia.Moreau@atlas.com", "subject": "Hi", "body": "Text"})
	last := s.emails.rows[len(s.emails.rows)-1]
	if last.label != 500 || s.emails.get(last, "email_id").s != "500" || s.emails.get(last, "sender/recipient").s != "nadia.moreau@atlas.com" ||
		!s.emails.get(last, "sent_datetime").ts || s.emails.get(last, "inbox/outbox").s != "outbox" {
		t.Fatalf("sent row %+v", last)
	}
	if got := call(t, s, "email.forward_email", Args{"email_id": "00000373", "recipient": "Raj.Patel@atlas.com"}); got != "Email forwarded successfully." {
		t.Fatal(got)
	}
	fw := s.emails.rows[len(s.emails.rows)-1]
	if s.emails.get(fw, "email_id").s != "501" || s.emails.get(fw, "subject").s != "FW: Task Update on Develop prototype for payment gateway" {
		t.Fatalf("forwarded row %+v", fw) // "500" > "00000499" as strings
	}
	if got := call(t, s, "email.forward_email", Args{"email_id": "12345678", "recipient": "not an address"}); got != "Email not found." {
		t.Fatalf("the email is checked before the address: %v", got)
	}
	if got := call(t, s, "email.reply_email", Args{"email_id": "00000373", "body": "Thanks"}); got != "Email replied successfully." {
		t.Fatal(got)
	}
	re := s.emails.rows[len(s.emails.rows)-1]
	if s.emails.get(re, "sender/recipient").s != "santiago.martinez@atlas.com" || s.emails.get(re, "subject").s != "Task Update on Develop prototype for payment gateway" {
		t.Fatalf("reply row %+v", re)
	}

	s = d.New()
	call(t, s, "email.delete_email", Args{"email_id": "00000373"})
	call(t, s, "email.send_email", Args{"recipient": "a@b.com", "subject": "s", "body": "b"})
	if len(s.emails.rows) != 499 || s.emails.get(s.emails.rows[498], "email_id").s != "500" {
		t.Fatalf("after a delete, loc[len] overwrote label 499: %d rows, last %+v", len(s.emails.rows), s.emails.rows[498])
	}
	// Search: every word somewhere in subject, body or sender, newest first.
	got := call(t, s, "email.search_emails", Args{"query": "payment gateway", "date_min": "2023-10-01", "date_max": "2023-11-30"})
	es := got.([]map[string]any)
	for i := 1; i < len(es); i++ {
		if es[i]["sent_datetime"].(string) > es[i-1]["sent_datetime"].(string) {
			t.Fatalf("not newest first: %v", es)
		}
	}
	if _, err := s.Call("email.search_emails", Args{"query": "a"}); err == nil {
		t.Fatal("sorting the sent email's Timestamp among strings raises in pandas")
	}
}

// TestOtherTools: analytics, project management, CRM and the directory.
func TestOtherTools(t *testing.T) {
	s := Default().New()
	if got := call(t, s, "analytics.create_plot", Args{"time_min": "2023-11-01", "time_max": "2023-11-29", "value_to_plot": "total_visits", "plot_type": "bar"}); got != "plots/2023-11-01_2023-11-29_total_visits_bar.png" {
		t.Fatal(got)
	}
	if got := call(t, s, "analytics.create_plot", Args{"time_min": "a", "time_max": "b", "value_to_plot": "direct", "plot_type": "bar"}); !strings.HasPrefix(got.(string), "Value to plot must be one of") {
		t.Fatal(got)
	}
	visits := call(t, s, "analytics.total_visits_count", Args{"time_min": "2023-11-20", "time_max": "2023-11-22"}).(map[string]int)
	direct := call(t, s, "analytics.traffic_source_count", Args{"time_min": "2023-11-20", "time_max": "2023-11-22", "traffic_source": "direct"}).(map[string]int)
	if len(visits) != 3 || len(direct) != 3 {
		t.Fatalf("visits %v, direct %v", visits, direct)
	}
	for day, n := range visits {
		if direct[day] > n || n == 0 {
			t.Fatalf("day %s: %d visits, %d direct", day, n, direct[day])
		}
	}

	if got := call(t, s, "project_management.create_task", Args{"task_name": "x", "assigned_to_email": "nobody@atlas.com", "list_name": "Backlog", "due_date": "2023-12-01", "board": "Design"}); got != "Assignee email not valid. Please choose from the list of team members." {
		t.Fatal(got)
	}
	if got := call(t, s, "project_management.create_task", Args{"task_name": "x", "assigned_to_email": "Aisha.Chen@atlas.com", "list_name": "backlog", "due_date": "2023-12-01", "board": "Design"}); !strings.HasPrefix(got.(string), "List not valid") {
		t.Fatal(got)
	}
	if got := call(t, s, "project_management.create_task", Args{"task_name": "x", "assigned_to_email": "Aisha.Chen@atlas.com", "list_name": "Backlog", "due_date": "2023-12-01", "board": "Design"}); got != "00000300" {
		t.Fatal(got)
	}
	if l := s.tasks.rows[len(s.tasks.rows)-1].label; l != 300 {
		t.Fatalf("ignore_index label %d", l)
	}
	if got := call(t, s, "project_management.update_task", Args{"task_id": "00000300", "field": "colour", "new_value": "red"}); got != "Field not valid." {
		t.Fatal(got)
	}
	found := call(t, s, "project_management.search_tasks", Args{"task_name": "^X$", "board": "design"}).([]map[string]any)
	if len(found) != 1 || found[0]["task_id"] != "00000300" {
		t.Fatalf("search %v", found)
	}

	s.crm = deleteWhere(s.crm, "customer_id", "00000189") // the relabelling below then moves labels
	id := call(t, s, "customer_relationship_manager.add_customer", Args{"customer_name": "Ada", "assigned_to_email": "LENA.schmidt@atlas.com", "status": "Lead"})
	if id != "00000200" {
		t.Fatal(id)
	}
	last := s.crm.rows[len(s.crm.rows)-1]
	if last.label != 199 || s.crm.get(last, "notes").null || s.crm.get(last, "notes").s != "" || !s.crm.get(last, "customer_phone").null ||
		s.crm.get(last, "assigned_to_email").s != "lena.schmidt@atlas.com" {
		t.Fatalf("added %+v", last)
	}
	if got := call(t, s, "customer_relationship_manager.update_customer", Args{"customer_id": "00000200", "field": "status", "new_value": "lead"}); !strings.HasPrefix(got.(string), "Status not valid") {
		t.Fatal(got)
	}
	cs := call(t, s, "customer_relationship_manager.search_customers", Args{"status": "lead", "follow_up_by_min": "2023-12-01"}).([]map[string]any)
	if len(cs) == 0 || len(cs) > 5 {
		t.Fatalf("customers %v", cs)
	}
	for _, c := range cs {
		if c["status"] != "Lead" || c["follow_up_by"].(string) < "2023-12-01" {
			t.Fatalf("customer %v", c)
		}
	}
	if got := call(t, s, "company_directory.find_email_address", Args{"name": "Nadia"}); !reflect.DeepEqual(got, []string{"nadia.moreau@atlas.com"}) {
		t.Fatalf("directory %v", got)
	}
}

// TestActions: action strings as WorkBench's eval reads them.
func TestActions(t *testing.T) {
	a, err := ParseAction(`email.send_email.func(recipient="a@b.com", subject="Hi", body="Line one\nLine \"two\"")`)
	if err != nil || a.Tool != "email.send_email" || a.Args()["body"] != "Line one\nLine \"two\"" {
		t.Fatalf("%+v %v", a, err)
	}
	for _, bad := range []string{`email.send_email(recipient="a")`, `email.send_email.func(recipient="a "quoted" b")`, `x.y.func(n=3)`} {
		if _, err := ParseAction(bad); err == nil {
			t.Errorf("%s parsed", bad)
		}
	}
	if got := (Action{Tool: "calendar.delete_event", Keys: []string{"event_id"}, Vals: []string{"00000001"}}).String(); got != `calendar.delete_event.func(event_id="00000001")` {
		t.Fatal(got)
	}
	for v, want := range map[any]string{"x": "x", true: "True", nil: "None", 60.0: "60", 1.5: "1.5"} {
		if got := PyValue(v); got != want {
			t.Errorf("PyValue(%v) = %q, want %q", v, got, want)
		}
	}
	if _, err := LoadTasks(filepath.Join("data", "emails.csv")); err == nil || !strings.Contains(err.Error(), `no "query" column`) {
		t.Fatalf("a table as tasks: %v", err)
	}
}
