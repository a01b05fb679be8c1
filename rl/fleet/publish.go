package fleet

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/agemem/agemem/model/lora"
)

// Adapter is a published adapter: its versioned name (prefix-vN-sha8, so
// that a name binds its bytes), its directory and its checksum.
type Adapter struct {
	Name    string
	Version int
	Dir     string
	SHA256  string // of its manifest, which lists its files' checksums
}

// Publisher writes adapters where engines load them: a directory engines
// read (a shared filesystem: rl.adapter_dir), or one the trainer serves
// over HTTP (rl.out/adapters, at rl.adapter_addr).
type Publisher struct {
	dir    string
	prefix string
	shared bool
	ln     net.Listener
	hs     *http.Server
}

// NewPublisher publishes under dir; shared says engines read dir itself,
// else the publisher serves it over HTTP on addr ("" or ":0": a free port
// on every interface).
func NewPublisher(dir, prefix string, shared bool, addr string) (*Publisher, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("adapters: %w", err)
	}
	p := &Publisher{dir: dir, prefix: prefix, shared: shared}
	if shared {
		return p, nil
	}
	if addr == "" {
		addr = ":0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rl.adapter_addr %q: %w", addr, err)
	}
	p.ln = ln
	mux := http.NewServeMux()
	mux.Handle("GET /adapters/", http.StripPrefix("/adapters/", http.FileServer(onlyFiles{http.Dir(dir)})))
	p.hs = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go p.hs.Serve(ln)
	return p, nil
}

// onlyFiles serves files, never a directory's listing.
type onlyFiles struct{ fs http.FileSystem }

func (o onlyFiles) Open(name string) (http.File, error) {
	f, err := o.fs.Open(name)
	if err != nil {
		return nil, err
	}
	if st, err := f.Stat(); err != nil || st.IsDir() {
		f.Close()
		return nil, os.ErrNotExist
	}
	return f, nil
}

// Close stops serving.
func (p *Publisher) Close() {
	if p.hs != nil {
		p.hs.Close()
	}
}

// Publish writes a version of the adapter: to a temporary directory, its
// manifest last, then renamed into place, so that an engine never reads a
// half-written one (and the manifest's checksums catch a torn copy).
func (p *Publisher) Publish(version int, a *lora.Adapter) (Adapter, error) {
	tmp, err := os.MkdirTemp(p.dir, ".publishing-")
	if err != nil {
		return Adapter{}, fmt.Errorf("publishing adapter v%d: %w", version, err)
	}
	defer os.RemoveAll(tmp)
	if err := a.Save(tmp); err != nil {
		return Adapter{}, fmt.Errorf("publishing adapter v%d: %w", version, err)
	}
	files := map[string]string{}
	for _, f := range []string{"adapter_config.json", "adapter_model.safetensors"} {
		b, err := os.ReadFile(filepath.Join(tmp, f))
		if err != nil {
			return Adapter{}, err
		}
		h := sha256.Sum256(b)
		files[f] = hex.EncodeToString(h[:])
	}
	// The name carries the weights' checksum: two ranks (or two runs)
	// that published different bytes can never share a name.
	wh := sha256.Sum256([]byte(files["adapter_model.safetensors"] + files["adapter_config.json"]))
	name := fmt.Sprintf("%s-v%d-%s", p.prefix, version, hex.EncodeToString(wh[:4]))
	man, err := json.MarshalIndent(lora.Manifest{Name: name, Version: version, Files: files}, "", "  ")
	if err != nil {
		return Adapter{}, err
	}
	if err := os.WriteFile(filepath.Join(tmp, lora.ManifestFile), man, 0o644); err != nil {
		return Adapter{}, err
	}
	dst := filepath.Join(p.dir, name)
	if _, err := os.Stat(dst); err == nil {
		// Published before (a resumed run, the same weights): the name
		// binds the bytes, so the copy there is this one.
		return Adapter{Name: name, Version: version, Dir: dst, SHA256: sum(man)}, nil
	}
	if err := os.Rename(tmp, dst); err != nil {
		return Adapter{}, fmt.Errorf("publishing adapter %s: %w", name, err)
	}
	return Adapter{Name: name, Version: version, Dir: dst, SHA256: sum(man)}, nil
}

// Remove deletes a published version engines no longer hold.
func (p *Publisher) Remove(a Adapter) {
	if a.Dir != "" && filepath.Dir(a.Dir) == filepath.Clean(p.dir) {
		os.RemoveAll(a.Dir)
	}
}

// PathFor is the lora_path an engine at engineURL loads a from: the
// directory itself (shared), else its URL on this host's address that
// routes to the engine.
func (p *Publisher) PathFor(a Adapter, engineURL string) string {
	if p.shared {
		abs, err := filepath.Abs(a.Dir)
		if err != nil {
			return a.Dir
		}
		return abs
	}
	port := p.ln.Addr().(*net.TCPAddr).Port
	host := localAddrToward(engineURL)
	return "http://" + net.JoinHostPort(host, strconv.Itoa(port)) + "/adapters/" + a.Name
}

// localAddrToward is this host's address on the route to u's host (no
// packet is sent).
func localAddrToward(u string) string {
	pu, err := url.Parse(u)
	if err != nil {
		return "127.0.0.1"
	}
	port := pu.Port()
	if port == "" {
		port = map[string]string{"https": "443"}[pu.Scheme]
		if port == "" {
			port = "80"
		}
	}
	c, err := net.Dial("udp", net.JoinHostPort(pu.Hostname(), port))
	if err != nil {
		return "127.0.0.1"
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String()
}

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}
