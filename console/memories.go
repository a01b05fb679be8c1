package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/agemem/agemem/memtools/ltm"
)

type memoriesData struct {
	Entries []ltm.Entry
	Hits    []ltm.Scored
	Query   string
	TopK    int
	Total   int
	Offset  int
	Prev    int // offset of the previous page (-1: none)
	Next    int // offset of the next page (-1: none)
	Form    memoryForm
	Error   string
}

// memoryForm is the add and edit forms' fields as the visitor typed them,
// kept when a form comes back with an error.
type memoryForm struct {
	Content, MemoryType, Metadata string
}

// withNamespace runs h with the namespace the page acts on, or shows why
// the login may not.
func (c *Console) withNamespace(w http.ResponseWriter, r *http.Request) (string, bool) {
	ns, status, msg := c.namespace(r)
	if status != 0 {
		c.fail(w, r, status, msg)
		return "", false
	}
	return ns, true
}

func (c *Console) nsPage(r *http.Request, ns, nav, title string, data any) *page {
	p := c.page(r, nav, title, data)
	p.NS = ns
	if p.Who.Admin && c.o.Memories != nil {
		p.All, _ = c.o.Memories.Namespaces(r.Context())
		if !slices.Contains(p.All, ns) {
			p.All = append(p.All, ns)
			slices.Sort(p.All)
		}
	}
	return p
}

func (c *Console) memories(w http.ResponseWriter, r *http.Request) {
	ns, ok := c.withNamespace(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	d := memoriesData{Query: strings.TrimSpace(q.Get("q")), TopK: 10, Prev: -1, Next: -1}
	c.listMemories(w, r, ns, q.Get("offset"), q.Get("top_k"), &d, http.StatusOK)
}

func (c *Console) listMemories(w http.ResponseWriter, r *http.Request, ns, offset, topK string, d *memoriesData, status int) {
	ctx := r.Context()
	if n, err := strconv.Atoi(topK); err == nil && n >= 1 && n <= 100 {
		d.TopK = n
	}
	var err error
	if d.Query != "" {
		d.Hits, err = c.o.Memories.Search(ctx, ns, d.Query, d.TopK)
	} else {
		d.Offset, _ = strconv.Atoi(offset)
		d.Offset = max(d.Offset, 0)
		size := c.o.Config.PageSize
		d.Entries, d.Total, err = c.o.Memories.Page(ctx, ns, d.Offset, size)
		if d.Offset > 0 {
			d.Prev = max(d.Offset-size, 0)
		}
		if d.Offset+size < d.Total {
			d.Next = d.Offset + size
		}
	}
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	c.render(w, status, "memories", c.nsPage(r, ns, "memories", "Memories of "+ns, d))
}

type memoryData struct {
	Entry ltm.Entry
	Form  memoryForm
	Error string
}

func (c *Console) memory(w http.ResponseWriter, r *http.Request) {
	ns, ok := c.withNamespace(w, r)
	if !ok {
		return
	}
	e, err := c.o.Memories.Get(r.Context(), ns, r.PathValue("id"))
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	d := memoryData{Entry: e, Form: memoryForm{Content: e.Content, Metadata: prettyJSON(e.Metadata)}}
	c.render(w, http.StatusOK, "memory", c.nsPage(r, ns, "memories", e.ID, d))
}

// parseMetadata reads the metadata field: a JSON object, or nothing (which
// clears the metadata on an edit and leaves it out on an add).
func parseMetadata(s string) (map[string]any, error) {
	if strings.TrimSpace(s) == "" {
		return map[string]any{}, nil
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil || m == nil {
		return nil, fmt.Errorf("metadata must be a JSON object such as {\"topic\": \"travel\"}")
	}
	if dec.More() {
		return nil, fmt.Errorf("metadata must be one JSON object")
	}
	return m, nil
}

func formOf(r *http.Request) memoryForm {
	return memoryForm{Content: r.PostForm.Get("content"), MemoryType: strings.TrimSpace(r.PostForm.Get("memory_type")), Metadata: r.PostForm.Get("metadata")}
}

// back sends the visitor to a page of ns after a change, saying what was
// done (303: a reload does not resend the form).
func back(w http.ResponseWriter, r *http.Request, path, ns, done string) {
	http.Redirect(w, r, path+"?namespace="+queryEscape(ns)+"&done="+done, http.StatusSeeOther)
}

// userError is a form's problem, or the store's refusal, to show beside
// the form; the rest fail the page.
func userError(err error) (string, bool) {
	var st interface{ HTTPStatus() int }
	if errors.As(err, &st) && st.HTTPStatus() == http.StatusBadRequest {
		return err.Error(), true
	}
	return "", false
}

func (c *Console) addMemory(w http.ResponseWriter, r *http.Request) {
	ns, ok := c.withNamespace(w, r)
	if !ok {
		return
	}
	f := formOf(r)
	md, err := parseMetadata(f.Metadata)
	if err == nil && strings.TrimSpace(f.Content) == "" {
		err = fmt.Errorf("a memory needs content")
	}
	if err == nil {
		if len(md) == 0 {
			md = nil
		}
		_, err = c.o.Memories.Add(r.Context(), sessionFrom(r.Context()).p, ns, Write{Content: f.Content, MemoryType: f.MemoryType, Metadata: md})
		if err == nil {
			back(w, r, Prefix+"/memories", ns, "added")
			return
		}
		msg, ok := userError(err)
		if !ok {
			c.failErr(w, r, err)
			return
		}
		err = fmt.Errorf("%s", msg)
	}
	d := memoriesData{TopK: 10, Prev: -1, Next: -1, Form: f, Error: err.Error()}
	c.listMemories(w, r, ns, "", "", &d, http.StatusBadRequest)
}

func (c *Console) updateMemory(w http.ResponseWriter, r *http.Request) {
	ns, ok := c.withNamespace(w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	f := formOf(r)
	md, err := parseMetadata(f.Metadata)
	if err == nil && strings.TrimSpace(f.Content) == "" {
		err = fmt.Errorf("a memory needs content")
	}
	if err == nil {
		_, err = c.o.Memories.Update(r.Context(), sessionFrom(r.Context()).p, ns, id, Write{Content: f.Content, Metadata: md})
		if err == nil {
			back(w, r, Prefix+"/memories/"+id, ns, "updated")
			return
		}
		msg, ok := userError(err)
		if !ok {
			c.failErr(w, r, err)
			return
		}
		err = fmt.Errorf("%s", msg)
	}
	e, gerr := c.o.Memories.Get(r.Context(), ns, id)
	if gerr != nil {
		c.failErr(w, r, gerr)
		return
	}
	c.render(w, http.StatusBadRequest, "memory", c.nsPage(r, ns, "memories", e.ID, memoryData{Entry: e, Form: f, Error: err.Error()}))
}

func (c *Console) confirmDelete(w http.ResponseWriter, r *http.Request) {
	ns, ok := c.withNamespace(w, r)
	if !ok {
		return
	}
	e, err := c.o.Memories.Get(r.Context(), ns, r.PathValue("id"))
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	c.render(w, http.StatusOK, "delete", c.nsPage(r, ns, "memories", "Delete "+e.ID, memoryData{Entry: e}))
}

func (c *Console) deleteMemory(w http.ResponseWriter, r *http.Request) {
	ns, ok := c.withNamespace(w, r)
	if !ok {
		return
	}
	if err := c.o.Memories.Delete(r.Context(), sessionFrom(r.Context()).p, ns, r.PathValue("id")); err != nil {
		c.failErr(w, r, err)
		return
	}
	back(w, r, Prefix+"/memories", ns, "deleted")
}

func (c *Console) exportMemories(w http.ResponseWriter, r *http.Request) {
	ns, ok := c.withNamespace(w, r)
	if !ok {
		return
	}
	// Written whole before the headers go, so a failure is still a page.
	var buf bytes.Buffer
	if err := c.o.Memories.Export(r.Context(), ns, &buf); err != nil {
		c.failErr(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", "memories-"+ns+".jsonl"))
	w.Write(buf.Bytes())
}

func compactJSON(v any) string {
	if m, ok := v.(map[string]any); ok && len(m) == 0 {
		return ""
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(raw)
}

func prettyJSON(v any) string {
	if v == nil {
		return ""
	}
	if m, ok := v.(map[string]any); ok && len(m) == 0 {
		return ""
	}
	raw, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(raw)
}
