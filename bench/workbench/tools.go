package workbench

import (
	"fmt"
	"slices"
	"strings"
)

// Tools are WorkBench's 27 tools, side effects first, in its toolkits'
// order. Each behaves as its Python original: the same checks in the same
// order, the same messages, the same effects on the tables.
var Tools = []Tool{
	{Name: "calendar.create_event", SideEffects: true, Description: "Creates a new event; returns its 8-digit ID.",
		Params: []Param{{Name: "event_name", Description: "Name of the event."}, {Name: "participant_email", Description: "Email of the participant."},
			{Name: "event_start", Description: `Start time, "YYYY-MM-DD HH:MM:SS".`}, {Name: "duration", Description: "Duration in minutes."}},
		run: createEvent},
	{Name: "calendar.delete_event", SideEffects: true, Description: "Deletes an event.",
		Params: []Param{{Name: "event_id", Description: "8-digit ID of the event."}}, run: deleteEvent},
	{Name: "calendar.update_event", SideEffects: true, Description: "Updates one field of an event.",
		Params: []Param{{Name: "event_id", Description: "8-digit ID of the event."}, {Name: "field", Description: "Field to update."},
			{Name: "new_value", Description: "New value for the field."}}, run: updateEvent},
	{Name: "email.send_email", SideEffects: true, Description: "Sends an email.",
		Params: []Param{{Name: "recipient", Description: "Email address of the recipient."}, {Name: "subject", Description: "Subject of the email."},
			{Name: "body", Description: "Body of the email."}}, run: sendEmail},
	{Name: "email.delete_email", SideEffects: true, Description: "Deletes an email.",
		Params: []Param{{Name: "email_id", Description: "8-digit ID of the email."}}, run: deleteEmail},
	{Name: "email.forward_email", SideEffects: true, Description: "Forwards an email to a recipient.",
		Params: []Param{{Name: "email_id", Description: "8-digit ID of the email."}, {Name: "recipient", Description: "Email address of the recipient."}},
		run:    forwardEmail},
	{Name: "email.reply_email", SideEffects: true, Description: "Replies to an email.",
		Params: []Param{{Name: "email_id", Description: "8-digit ID of the email."}, {Name: "body", Description: "Body of the reply."}}, run: replyEmail},
	{Name: "analytics.create_plot", SideEffects: true, Description: "Plots an analytics value over a date range; returns the plot's file path.",
		Params: []Param{{Name: "time_min", Description: `Start date, "YYYY-MM-DD".`}, {Name: "time_max", Description: `End date, "YYYY-MM-DD".`},
			{Name: "value_to_plot", Description: "One of total_visits, session_duration_seconds, user_engaged, visits_direct, visits_referral, visits_search_engine, visits_social_media."},
			{Name: "plot_type", Description: "One of bar, line, scatter, histogram."}}, run: createPlot},
	{Name: "project_management.create_task", SideEffects: true, Description: "Creates a task; returns its 8-digit ID.",
		Params: []Param{{Name: "task_name", Description: "Name of the task."}, {Name: "assigned_to_email", Description: "Email of the assignee (a team member)."},
			{Name: "list_name", Description: "One of Backlog, In Progress, In Review, Completed."}, {Name: "due_date", Description: `Due date, "YYYY-MM-DD".`},
			{Name: "board", Description: "One of Back end, Front end, Design."}}, run: createTask},
	{Name: "project_management.delete_task", SideEffects: true, Description: "Deletes a task.",
		Params: []Param{{Name: "task_id", Description: "8-digit ID of the task."}}, run: deleteTask},
	{Name: "project_management.update_task", SideEffects: true, Description: "Updates one field of a task.",
		Params: []Param{{Name: "task_id", Description: "8-digit ID of the task."}, {Name: "field", Description: "Field to update: task_name, assigned_to_email, list_name, due_date or board."},
			{Name: "new_value", Description: "New value for the field."}}, run: updateTask},
	{Name: "customer_relationship_manager.update_customer", SideEffects: true, Description: "Updates one field of a customer record.",
		Params: []Param{{Name: "customer_id", Description: "8-digit ID of the customer."}, {Name: "field", Description: "Field to update."},
			{Name: "new_value", Description: "New value for the field."}}, run: updateCustomer},
	{Name: "customer_relationship_manager.add_customer", SideEffects: true, Description: "Adds a customer record; returns its 8-digit ID.",
		Params: []Param{{Name: "customer_name", Description: "Name of the customer."}, {Name: "assigned_to_email", Description: "Email of the salesperson."},
			{Name: "status", Description: "One of Qualified, Won, Lost, Lead, Proposal."}, {Name: "customer_email", Description: "Email of the customer."},
			{Name: "customer_phone", Description: "Phone of the customer."}, {Name: "last_contact_date", Description: `"YYYY-MM-DD".`},
			{Name: "product_interest", Description: "One of Software, Hardware, Services, Consulting, Training."}, {Name: "notes", Description: "Notes."},
			{Name: "follow_up_by", Description: `"YYYY-MM-DD".`}}, run: addCustomer},
	{Name: "customer_relationship_manager.delete_customer", SideEffects: true, Description: "Deletes a customer record.",
		Params: []Param{{Name: "customer_id", Description: "8-digit ID of the customer."}}, run: deleteCustomer},

	{Name: "calendar.get_event_information_by_id", Description: "Returns one field of an event.",
		Params: []Param{{Name: "event_id", Description: "8-digit ID of the event."},
			{Name: "field", Description: "One of event_id, event_name, participant_email, event_start, duration."}},
		run: func(s *Sandbox, a Args) (any, error) {
			return fieldOf(s.calendar, "event_id", a["event_id"], a["field"], "Event"), nil
		}},
	{Name: "calendar.search_events", Description: "Returns at most 5 events whose name or participant matches the query, by start time.",
		Params: []Param{{Name: "query", Description: "Terms matched in event_name and participant_email."},
			{Name: "time_min", Description: `Lower bound, "YYYY-MM-DD HH:MM:SS".`}, {Name: "time_max", Description: `Upper bound, "YYYY-MM-DD HH:MM:SS".`}},
		run: searchEvents},
	{Name: "email.get_email_information_by_id", Description: "Returns one field of an email.",
		Params: []Param{{Name: "email_id", Description: "8-digit ID of the email."},
			{Name: "field", Description: "One of email_id, inbox/outbox, sender/recipient, subject, sent_datetime, body."}},
		run: func(s *Sandbox, a Args) (any, error) {
			return fieldOf(s.emails, "email_id", a["email_id"], a["field"], "Email"), nil
		}},
	{Name: "email.search_emails", Description: "Returns at most 5 emails, newest first, containing every query word in subject, body or sender/recipient.",
		Params: []Param{{Name: "query", Description: "Words to search for."}, {Name: "date_min", Description: `Lower bound, "YYYY-MM-DD".`},
			{Name: "date_max", Description: `Upper bound (inclusive), "YYYY-MM-DD".`}}, run: searchEmails},
	{Name: "analytics.engaged_users_count", Description: "Number of engaged users per day in a date range.",
		Params: []Param{{Name: "time_min", Description: `"YYYY-MM-DD".`}, {Name: "time_max", Description: `"YYYY-MM-DD".`}},
		run: func(s *Sandbox, a Args) (any, error) {
			t := inRange(s.analytics, "date_of_visit", a["time_min"], a["time_max"])
			return intCounts(countsByDay(t, func(r row) float64 { return b2f(t.get(r, "user_engaged").s == "True") })), nil
		}},
	{Name: "analytics.get_visitor_information_by_id", Description: "Returns the analytics records of a visitor.",
		Params: []Param{{Name: "visitor_id", Description: "ID of the visitor."}}, run: visitorInfo},
	{Name: "analytics.traffic_source_count", Description: "Number of visits per day in a date range, from one traffic source if given.",
		Params: []Param{{Name: "time_min", Description: `"YYYY-MM-DD".`}, {Name: "time_max", Description: `"YYYY-MM-DD".`},
			{Name: "traffic_source", Description: "One of direct, referral, search engine, social media."}},
		run: func(s *Sandbox, a Args) (any, error) {
			t := inRange(s.analytics, "date_of_visit", a["time_min"], a["time_max"])
			src := a["traffic_source"]
			return intCounts(countsByDay(t, func(r row) float64 {
				return b2f(src == "" || t.get(r, "traffic_source").s == src)
			})), nil
		}},
	{Name: "analytics.total_visits_count", Description: "Number of visits per day in a date range.",
		Params: []Param{{Name: "time_min", Description: `"YYYY-MM-DD".`}, {Name: "time_max", Description: `"YYYY-MM-DD".`}},
		run: func(s *Sandbox, a Args) (any, error) {
			t := inRange(s.analytics, "date_of_visit", a["time_min"], a["time_max"])
			return intCounts(countsByDay(t, func(row) float64 { return 1 })), nil
		}},
	{Name: "analytics.get_average_session_duration", Description: "Average session duration in seconds per day in a date range.",
		Params: []Param{{Name: "time_min", Description: `"YYYY-MM-DD".`}, {Name: "time_max", Description: `"YYYY-MM-DD".`}},
		run:    averageSession},
	{Name: "project_management.get_task_information_by_id", Description: "Returns one field of a task.",
		Params: []Param{{Name: "task_id", Description: "8-digit ID of the task."},
			{Name: "field", Description: "One of task_id, task_name, assigned_to_email, list_name, due_date, board."}},
		run: func(s *Sandbox, a Args) (any, error) {
			return fieldOf(s.tasks, "task_id", a["task_id"], a["field"], "Task"), nil
		}},
	{Name: "project_management.search_tasks", Description: "Returns the tasks matching every given field.",
		Params: []Param{{Name: "task_name"}, {Name: "assigned_to_email"}, {Name: "list_name"}, {Name: "due_date", Description: `"YYYY-MM-DD".`}, {Name: "board"}},
		run:    searchTasks},
	{Name: "customer_relationship_manager.search_customers", Description: "Returns at most 5 customers matching every given field and date bound.",
		Params: []Param{{Name: "customer_name"}, {Name: "customer_email"}, {Name: "product_interest"}, {Name: "status"}, {Name: "assigned_to_email"},
			{Name: "last_contact_date_min", Description: `"YYYY-MM-DD".`}, {Name: "last_contact_date_max", Description: `"YYYY-MM-DD".`},
			{Name: "follow_up_by_min", Description: `"YYYY-MM-DD".`}, {Name: "follow_up_by_max", Description: `"YYYY-MM-DD".`}},
		run: searchCustomers},
	{Name: "company_directory.find_email_address", Description: "Finds the email addresses of the company's people whose address contains the name.",
		Params: []Param{{Name: "name", Description: "Name of the person."}}, run: findEmailAddress},
}

func createEvent(s *Sandbox, a Args) (any, error) {
	switch {
	case a["event_name"] == "":
		return "Event name not provided.", nil
	case a["participant_email"] == "":
		return "Participant email not provided.", nil
	case a["event_start"] == "":
		return "Event start not provided.", nil
	case a["duration"] == "":
		return "Event duration not provided.", nil
	}
	id, err := nextID(s.calendar, "event_id", true)
	if err != nil {
		return nil, err
	}
	// pd.concat without ignore_index: the new row keeps its own label 0.
	s.calendar.concat(map[string]cell{"event_id": str(id), "event_name": str(a["event_name"]),
		"participant_email": str(strings.ToLower(a["participant_email"])), "event_start": str(a["event_start"]), "duration": str(a["duration"])}, false)
	return id, nil
}

// remove is the delete tools: the id checked, then the rows holding it
// dropped (df = df[df[idCol] != id]), with the tool's messages.
func remove(t **table, idCol, id, what string) string {
	if id == "" {
		return what + " ID not provided."
	}
	if !(*t).has(idCol, id) {
		return what + " not found."
	}
	*t = deleteWhere(*t, idCol, id)
	return what + " deleted successfully."
}

// deleteWhere drops the rows whose idCol is id.
func deleteWhere(t *table, idCol, id string) *table {
	return t.filter(func(r row) bool { v := t.get(r, idCol); return v.null || v.s != id })
}

func deleteEvent(s *Sandbox, a Args) (any, error) {
	return remove(&s.calendar, "event_id", a["event_id"], "Event"), nil
}

// setField is df.loc[df[idCol] == id, field] = v. A field that is not a
// column adds one in pandas; WorkBench's states would then differ in
// columns, which equalLower sees as a difference too.
func setField(t *table, idCol, id, field, v string) {
	if t.col(field) < 0 {
		t.cols = append(slices.Clone(t.cols), field)
		for i := range t.rows {
			t.rows[i].vals = append(t.rows[i].vals, cell{null: true})
		}
	}
	t.set(func(r row) bool { c := t.get(r, idCol); return !c.null && c.s == id }, field, str(v))
}

func updateEvent(s *Sandbox, a Args) (any, error) {
	id, field, v := a["event_id"], a["field"], a["new_value"]
	if id == "" || field == "" || v == "" {
		return "Event ID, field, or new value not provided.", nil
	}
	if !s.calendar.has("event_id", id) {
		return "Event not found.", nil
	}
	if field == "participant_email" {
		v = strings.ToLower(v)
	}
	setField(s.calendar, "event_id", id, field, v)
	return "Event updated successfully.", nil
}

func validAddress(v string) bool { return strings.Contains(v, "@") && strings.Contains(v, ".") }

func sendEmail(s *Sandbox, a Args) (any, error) {
	to, subject, body := a["recipient"], a["subject"], a["body"]
	if to == "" || subject == "" || body == "" {
		return "Recipient, subject, or body not provided.", nil
	}
	if !validAddress(to) {
		return "Invalid recipient email address.", nil
	}
	id, err := nextID(s.emails, "email_id", false)
	if err != nil {
		return nil, err
	}
	// EMAILS.loc[len(EMAILS)] = [...]: a label an earlier delete left in
	// use is overwritten, as pandas does.
	s.emails.locSet(len(s.emails.rows), []cell{str(id), str("outbox"), str(strings.ToLower(to)), str(subject),
		{s: CurrentTime, ts: true}, str(body)})
	return "Email sent successfully.", nil
}

func deleteEmail(s *Sandbox, a Args) (any, error) {
	return remove(&s.emails, "email_id", a["email_id"], "Email"), nil
}

// emailByID is the first email with id.
func emailByID(s *Sandbox, id string) (row, bool) {
	for _, r := range s.emails.rows {
		if v := s.emails.get(r, "email_id"); !v.null && v.s == id {
			return r, true
		}
	}
	return row{}, false
}

func forwardEmail(s *Sandbox, a Args) (any, error) {
	id, to := a["email_id"], a["recipient"]
	if id == "" || to == "" {
		return "Email ID or recipient not provided.", nil
	}
	e, ok := emailByID(s, id)
	if !ok {
		return "Email not found.", nil
	}
	if !validAddress(to) {
		return "Invalid recipient email address.", nil
	}
	res, err := sendEmail(s, Args{"recipient": strings.ToLower(to), "subject": "FW: " + pyStr(s.emails.get(e, "subject")), "body": pyStr(s.emails.get(e, "body"))})
	if res == "Email sent successfully." {
		return "Email forwarded successfully.", err
	}
	return res, err
}

func replyEmail(s *Sandbox, a Args) (any, error) {
	id, body := a["email_id"], a["body"]
	if id == "" || body == "" {
		return "Email ID or body not provided.", nil
	}
	e, ok := emailByID(s, id)
	if !ok {
		return "Email not found.", nil
	}
	res, err := sendEmail(s, Args{"recipient": pyStr(s.emails.get(e, "sender/recipient")), "subject": pyStr(s.emails.get(e, "subject")), "body": body})
	if res == "Email sent successfully." {
		return "Email replied successfully.", err
	}
	return res, err
}

// pyStr is a cell as Python's f-string shows it: a missing value is "nan".
func pyStr(c cell) string {
	if c.null {
		return "nan"
	}
	return c.s
}

func createPlot(s *Sandbox, a Args) (any, error) {
	switch {
	case a["time_min"] == "":
		return "Start date not provided.", nil
	case a["time_max"] == "":
		return "End date not provided.", nil
	case !slices.Contains([]string{"total_visits", "session_duration_seconds", "user_engaged", "visits_direct", "visits_referral", "visits_search_engine", "visits_social_media"}, a["value_to_plot"]):
		return "Value to plot must be one of 'total_visits', 'session_duration_seconds', 'user_engaged', 'direct', 'referral', 'search engine', 'social media'", nil
	case !slices.Contains([]string{"bar", "line", "scatter", "histogram"}, a["plot_type"]):
		return "Plot type must be one of 'bar', 'line', 'scatter', or 'histogram'", nil
	}
	path := fmt.Sprintf("plots/%s_%s_%s_%s.png", a["time_min"], a["time_max"], a["value_to_plot"], a["plot_type"])
	s.plots.locSet(len(s.plots.rows), []cell{str(path)})
	return path, nil
}

var (
	lists  = []string{"Backlog", "In Progress", "In Review", "Completed"}
	boards = []string{"Back end", "Front end", "Design"}
)

// isMember reports whether email is an assignee of some task (the tools'
// list of team members), compared lower-case.
func isMember(s *Sandbox, email string) bool {
	for _, r := range s.tasks.rows {
		if v := s.tasks.get(r, "assigned_to_email"); !v.null && strings.ToLower(v.s) == email {
			return true
		}
	}
	return false
}

func createTask(s *Sandbox, a Args) (any, error) {
	name, who, list, due, board := a["task_name"], a["assigned_to_email"], a["list_name"], a["due_date"], a["board"]
	if name == "" || who == "" || list == "" || due == "" || board == "" {
		return "Missing task details.", nil
	}
	who = strings.ToLower(who)
	if !isMember(s, who) {
		return "Assignee email not valid. Please choose from the list of team members.", nil
	}
	if !slices.Contains(lists, list) {
		return "List not valid. Please choose from: 'Backlog', 'In Progress', 'In Review', 'Completed'.", nil
	}
	if !slices.Contains(boards, board) {
		return "Board not valid. Please choose from: 'Back end', 'Front end', 'Design'.", nil
	}
	id, err := nextID(s.tasks, "task_id", true)
	if err != nil {
		return nil, err
	}
	s.tasks.concat(map[string]cell{"task_id": str(id), "task_name": str(name), "assigned_to_email": str(who),
		"list_name": str(list), "due_date": str(due), "board": str(board)}, true)
	return id, nil
}

func deleteTask(s *Sandbox, a Args) (any, error) {
	return remove(&s.tasks, "task_id", a["task_id"], "Task"), nil
}

func updateTask(s *Sandbox, a Args) (any, error) {
	id, field, v := a["task_id"], a["field"], a["new_value"]
	if id == "" || field == "" || v == "" {
		return "Task ID, field, or new value not provided.", nil
	}
	if field == "assigned_to_email" {
		v = strings.ToLower(v)
	}
	switch {
	case field == "board" && !slices.Contains(boards, v):
		return "Board not valid. Please choose from: 'Back end', 'Front end', 'Design'.", nil
	case field == "list_name" && !slices.Contains(lists, v):
		return "List not valid. Please choose from: 'Backlog', 'In Progress', 'In Review', 'Completed'.", nil
	case field == "assigned_to_email" && !isMember(s, v):
		return "Assignee email not valid. Please choose from the list of team members.", nil
	}
	if !s.tasks.has("task_id", id) {
		return "Task not found.", nil
	}
	if s.tasks.col(field) < 0 {
		return "Field not valid.", nil
	}
	setField(s.tasks, "task_id", id, field, v)
	return "Task updated successfully.", nil
}

func updateCustomer(s *Sandbox, a Args) (any, error) {
	id, field, v := a["customer_id"], a["field"], a["new_value"]
	if id == "" || field == "" || v == "" {
		return "Customer ID, field, or new value not provided.", nil
	}
	if field == "status" && !slices.Contains([]string{"Qualified", "Won", "Lost", "Lead", "Proposal"}, v) {
		return "Status not valid. Please choose from: 'Qualified', 'Won', 'Lost', 'Lead', 'Proposal'", nil
	}
	if field == "product_interest" && !slices.Contains([]string{"Software", "Hardware", "Services", "Consulting", "Training"}, v) {
		return "Product interest not valid. Please choose from: 'Software', 'Hardware', 'Services', 'Consulting', 'Training'", nil
	}
	if field == "customer_email" || field == "assigned_to_email" {
		v = strings.ToLower(v)
	}
	if !s.crm.has("customer_id", id) {
		return "Customer not found.", nil
	}
	if s.crm.col(field) < 0 {
		return "Field not valid. Please choose from: 'customer_name', 'assigned_to_email', 'customer_email', 'customer_phone', 'last_contact_date', 'product_interest', 'status', 'notes', 'follow_up_by'", nil
	}
	setField(s.crm, "customer_id", id, field, v)
	return "Customer updated successfully.", nil
}

func addCustomer(s *Sandbox, a Args) (any, error) {
	name, who, status := a["customer_name"], a["assigned_to_email"], a["status"]
	if name == "" || who == "" || status == "" {
		return "Please provide all required fields: customer_name, assigned_to_email, status.", nil
	}
	id, err := nextID(s.crm, "customer_id", true)
	if err != nil {
		return nil, err
	}
	opt := func(k string, lower bool) cell {
		v, ok := a[k]
		if !ok {
			return cell{null: true} // None
		}
		if lower && v != "" {
			v = strings.ToLower(v)
		}
		return str(v)
	}
	notes, ok := a["notes"]
	if !ok {
		notes = "" // the signature's default
	}
	s.crm.concat(map[string]cell{"customer_id": str(id), "customer_name": str(name), "customer_email": opt("customer_email", true),
		"customer_phone": opt("customer_phone", false), "last_contact_date": opt("last_contact_date", false),
		"product_interest": opt("product_interest", false), "status": str(status), "assigned_to_email": str(strings.ToLower(who)),
		"notes": str(notes), "follow_up_by": opt("follow_up_by", false)}, true)
	return id, nil
}

func deleteCustomer(s *Sandbox, a Args) (any, error) {
	return remove(&s.crm, "customer_id", a["customer_id"], "Customer"), nil
}
