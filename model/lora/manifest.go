package lora

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
)

// ManifestFile names an adapter directory's manifest: what a trainer
// publishes beside the adapter, so that an engine loads the bytes the
// trainer wrote or none (a torn copy on a shared filesystem, a truncated
// download).
const ManifestFile = "agemem_adapter.json"

// Manifest lists a published adapter's files with their SHA-256.
type Manifest struct {
	Name    string            `json:"name"`
	Version int               `json:"version"`
	Files   map[string]string `json:"files"` // file name -> SHA-256, hex
}

// ReadManifest parses a manifest, which must list both adapter files and
// only plain file names.
func ReadManifest(raw []byte) (Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return m, fmt.Errorf("%s: %v", ManifestFile, err)
	}
	for _, f := range []string{"adapter_config.json", "adapter_model.safetensors"} {
		if m.Files[f] == "" {
			return m, fmt.Errorf("%s lists no checksum of %s", ManifestFile, f)
		}
	}
	for f := range m.Files {
		if f != filepath.Base(f) || strings.HasPrefix(f, ".") {
			return m, fmt.Errorf("%s names %q, not a file of the adapter's directory", ManifestFile, f)
		}
	}
	return m, nil
}

// Check holds file name's bytes to the manifest.
func (m Manifest) Check(name string, b []byte) error {
	if got, want := Sum(b), m.Files[name]; got != want {
		return fmt.Errorf("%s has SHA-256 %s, its manifest says %s (a torn or stale copy)", name, got, want)
	}
	return nil
}

// Sum is the SHA-256 of b, hex.
func Sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}
