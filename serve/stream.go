package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"unicode"

	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools"
)

// errAnswerCut ends a streamed loop whose step sent answer text but did not
// finish a valid answer: the text already sent cannot be taken back.
var errAnswerCut = errors.New("a streamed answer was not completed")

// sseStream writes a chat completion as server-sent events. Only the
// final answer is content: intermediate steps are tool calls the server
// runs itself. Answer text is sent as the model writes it; the response's
// status is held back until the first text, so a request that fails
// before answering still gets its error status.
type sseStream struct {
	w            http.ResponseWriter
	base         chatResponse
	includeUsage bool

	mu      sync.Mutex // guards everything below and every write to w
	text    func() string
	header  bool
	sent    string // answer text sent in the current step
	notify  chan struct{}
	quit    chan struct{}
	stopped chan struct{}
}

func newSSEStream(w http.ResponseWriter, base chatResponse, includeUsage bool) *sseStream {
	base.Object = "chat.completion.chunk"
	st := &sseStream{w: w, base: base, includeUsage: includeUsage,
		notify: make(chan struct{}, 1), quit: make(chan struct{}), stopped: make(chan struct{})}
	go st.writer()
	return st
}

// progress is Gen.Progress: it only records where the text is and wakes
// the writer, so the decoding loop never waits on a slow client.
func (st *sseStream) progress(text func() string) {
	st.mu.Lock()
	st.text = text
	st.mu.Unlock()
	select {
	case st.notify <- struct{}{}:
	default:
	}
}

func (st *sseStream) writer() {
	defer close(st.stopped)
	for {
		select {
		case <-st.notify:
			st.mu.Lock()
			if st.text != nil {
				st.process(st.text())
			}
			st.mu.Unlock()
		case <-st.quit:
			return
		}
	}
}

// stop ends the writer goroutine; the handler writes the rest itself.
func (st *sseStream) stop() {
	select {
	case <-st.quit:
	default:
		close(st.quit)
	}
	<-st.stopped
}

func (st *sseStream) started() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.header
}

// answerSoFar extracts the answer from a response being written: the body
// of its first <answer> block, if no tool call comes before it. Until the
// block closes, whitespace, a partial closing tag and a partial UTF-8
// character at the end are held back, so that what is sent is always a
// prefix of what the parser will return.
func answerSoFar(text string) (string, bool) {
	i := strings.Index(text, "<answer>")
	if i < 0 || strings.Contains(text[:i], "<tool_call>") {
		return "", false
	}
	body := text[i+len("<answer>"):]
	if j := strings.Index(body, "</answer>"); j >= 0 {
		return strings.TrimSpace(body[:j]), true
	}
	body = strings.TrimLeftFunc(body, unicode.IsSpace)
	const closing = "</answer>"
	for k := len(closing) - 1; k > 0; k-- {
		if strings.HasSuffix(body, closing[:k]) {
			body = body[:len(body)-k]
			break
		}
	}
	body = strings.TrimRight(body, "\uFFFD")
	return strings.TrimRightFunc(body, unicode.IsSpace), true
}

// process sends the answer text that text adds to what was sent. Called
// with mu held.
func (st *sseStream) process(text string) {
	body, ok := answerSoFar(text)
	if !ok || len(body) <= len(st.sent) || !strings.HasPrefix(body, st.sent) {
		return
	}
	delta := body[len(st.sent):]
	st.sent = body
	st.chunk(&outMessage{Content: &delta})
}

// start starts the response, if it is not yet: the headers and the
// assistant's role. Called with mu held.
func (st *sseStream) start() {
	if st.header {
		return
	}
	h := st.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	st.w.WriteHeader(http.StatusOK)
	st.header = true
	empty := ""
	st.event(st.w, chatChoice{Delta: &outMessage{Role: "assistant", Content: &empty}}, nil, nil)
	st.flush()
}

// chunk writes one event of answer text, starting the response first if
// needed. Called with mu held.
func (st *sseStream) chunk(delta *outMessage) {
	st.start()
	st.event(st.w, chatChoice{Delta: delta}, nil, nil)
	st.flush()
}

// event writes one event to w: c is its choice, or nil for none.
func (st *sseStream) event(w io.Writer, c any, u *usage, info *traceInfo) {
	ev := st.base
	ev.Usage, ev.AgeMem = u, info
	ev.Choices = []chatChoice{}
	if ch, ok := c.(chatChoice); ok {
		ev.Choices = []chatChoice{ch}
	}
	fmt.Fprintf(w, "data: %s\n\n", marshal(ev))
}

func (st *sseStream) flush() {
	if f, ok := st.w.(http.Flusher); ok {
		f.Flush()
	}
}

// step is called at the start of every policy call: a previous step that
// sent answer text without ending the loop left an answer unfinished.
func (st *sseStream) step() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.sent != "" {
		return errAnswerCut
	}
	return nil
}

// settle processes a finished step's whole text, so nothing the writer
// has not yet seen is lost.
func (st *sseStream) settle(text string) {
	st.mu.Lock()
	st.process(text)
	st.mu.Unlock()
}

// finish sends what of the final answer is not yet sent.
func (st *sseStream) finish(tr memtools.Trace) *apiError {
	st.stop()
	st.mu.Lock()
	defer st.mu.Unlock()
	if !tr.HasAnswer {
		if st.sent != "" {
			return outcome(tr, errAnswerCut)
		}
		return nil
	}
	if !strings.HasPrefix(tr.Answer, st.sent) {
		return outcome(tr, errAnswerCut)
	}
	if rest := tr.Answer[len(st.sent):]; rest != "" || !st.header {
		st.sent = tr.Answer
		st.chunk(&outMessage{Content: &rest})
	}
	return nil
}

// end sends the finish reason with the trace, the usage if asked, and
// [DONE]. commit runs first, given those events: if it fails, the stream
// ends with its error instead, unfinished.
func (st *sseStream) end(finish string, u usage, info *traceInfo, commit func(tail []byte) *apiError) {
	st.stop()
	st.mu.Lock()
	defer st.mu.Unlock()
	st.start()
	var tail bytes.Buffer
	st.event(&tail, chatChoice{Delta: &outMessage{}, FinishReason: &finish}, nil, info)
	if st.includeUsage {
		st.event(&tail, nil, &u, nil) // the usage chunk has no choices
	}
	tail.WriteString("data: [DONE]\n\n")
	out := tail.Bytes()
	if aerr := commit(out); aerr != nil {
		out = fmt.Appendf(nil, "data: %s\n\ndata: [DONE]\n\n", marshal(map[string]*apiError{"error": aerr}))
	}
	st.w.Write(out)
	st.flush()
}

// fail reports an error inside a stream already under way.
func (st *sseStream) fail(e *apiError) {
	st.stop()
	st.mu.Lock()
	defer st.mu.Unlock()
	fmt.Fprintf(st.w, "data: %s\n\ndata: [DONE]\n\n", marshal(map[string]*apiError{"error": e}))
	st.flush()
}

// stepPolicy marks the step boundaries of a streamed loop.
type stepPolicy struct {
	inner  llm.Model
	stream *sseStream
}

func (p *stepPolicy) Chat(ctx context.Context, req llm.Request) (llm.Response, error) {
	if err := p.stream.step(); err != nil {
		return llm.Response{}, err
	}
	c, err := p.inner.Chat(ctx, req)
	if err == nil {
		p.stream.settle(c.Message.Content)
	}
	return c, err
}

// marshal is json.Marshal without HTML escaping, so traces read as the
// model wrote them (<think>, not \u003cthink\u003e), as in non-streamed
// responses.
func marshal(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}
