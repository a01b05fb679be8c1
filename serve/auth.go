package serve

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
)

// principal is who a request acts as: the namespace its key maps to and
// whether the key is an admin's (which may name any namespace).
type principal struct {
	Namespace string
	Admin     bool
	KeyID     string // a short hash of the key, for logs
}

// keyring checks API keys. Keys are compared as SHA-256 digests in
// constant time, and every key is compared, so neither a key's length nor
// its position leaks through timing.
type keyring struct {
	keys []keyEntry
	open principal // used when there are no keys at all
}

type keyEntry struct {
	digest [32]byte
	p      principal
}

var namespaceRE = regexp.MustCompile(`^[A-Za-z0-9._@:-]{1,128}$`)

// newKeyring reads keys from the config and from the environment variable
// it names ("key=namespace,…"; namespace * makes an admin key).
func newKeyring(sv Config, defaultNS string) (*keyring, error) {
	kr := &keyring{open: principal{Namespace: defaultNS, KeyID: "open"}}
	add := func(where string, k APIKey) error {
		if len(k.Key) < 8 {
			return fmt.Errorf("%s: a key must be at least 8 characters", where)
		}
		if k.Namespace != "" && !namespaceRE.MatchString(k.Namespace) {
			return fmt.Errorf("%s: namespace %q: use 1-128 letters, digits and . _ @ : -", where, k.Namespace)
		}
		ns := k.Namespace
		if ns == "" {
			ns = defaultNS
		}
		d := sha256.Sum256([]byte(k.Key))
		for _, e := range kr.keys {
			if e.digest == d {
				return fmt.Errorf("%s: the key is given twice", where)
			}
		}
		kr.keys = append(kr.keys, keyEntry{d, principal{Namespace: ns, Admin: k.Admin, KeyID: fmt.Sprintf("%x", d[:4])}})
		return nil
	}
	for i, k := range sv.Keys {
		if err := add(fmt.Sprintf("serve.keys[%d]", i), k); err != nil {
			return nil, err
		}
	}
	if sv.KeysEnv != "" {
		for i, item := range strings.Split(os.Getenv(sv.KeysEnv), ",") {
			item = strings.TrimSpace(item)
			if item == "" {
				continue
			}
			key, ns, ok := strings.Cut(item, "=")
			where := fmt.Sprintf("$%s item %d", sv.KeysEnv, i+1)
			if !ok || ns == "" {
				return nil, fmt.Errorf("%s: want key=namespace (namespace * for an admin key)", where)
			}
			k := APIKey{Key: key, Namespace: ns}
			if ns == "*" {
				k = APIKey{Key: key, Admin: true}
			}
			if err := add(where, k); err != nil {
				return nil, err
			}
		}
	}
	return kr, nil
}

// authenticate returns the request's principal: from "Authorization:
// Bearer KEY" or "X-API-Key: KEY".
func (kr *keyring) authenticate(r *http.Request) (principal, *apiError) {
	if len(kr.keys) == 0 {
		return kr.open, nil
	}
	key := r.Header.Get("X-API-Key")
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, rest, _ := strings.Cut(h, " ")
		if !strings.EqualFold(scheme, "Bearer") {
			return principal{}, &apiError{Status: http.StatusUnauthorized, Type: "authentication_error", Code: "invalid_api_key", Message: "the Authorization header must be 'Bearer <key>'"}
		}
		key = strings.TrimSpace(rest)
	}
	if key == "" {
		return principal{}, &apiError{Status: http.StatusUnauthorized, Type: "authentication_error", Code: "missing_api_key", Message: "no API key: send 'Authorization: Bearer <key>'"}
	}
	return kr.lookup(key)
}

func (kr *keyring) lookup(key string) (principal, *apiError) {
	d := sha256.Sum256([]byte(key))
	found := -1
	for i, e := range kr.keys {
		if subtle.ConstantTimeCompare(d[:], e.digest[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return principal{}, &apiError{Status: http.StatusUnauthorized, Type: "authentication_error", Code: "invalid_api_key", Message: "the API key is not valid"}
	}
	return kr.keys[found].p, nil
}

// namespace is the namespace a request acts on: its key's, or for an admin
// the one named by the X-AgeMem-Namespace header or ?namespace=. A
// non-admin key naming another namespace gets 403.
func namespace(r *http.Request, p principal) (string, *apiError) {
	ns := r.Header.Get("X-AgeMem-Namespace")
	if q := r.URL.Query().Get("namespace"); q != "" {
		ns = q
	}
	if ns == "" || ns == p.Namespace {
		return p.Namespace, nil
	}
	if !p.Admin {
		return "", &apiError{Status: http.StatusForbidden, Type: "permission_error", Code: "namespace_forbidden", Message: fmt.Sprintf("this key may not use namespace %q", ns)}
	}
	if !namespaceRE.MatchString(ns) {
		return "", errInvalid("namespace", "invalid_namespace", fmt.Sprintf("namespace %q: use 1-128 letters, digits and . _ @ : -", ns))
	}
	return ns, nil
}

type principalKey struct{}

func withPrincipal(ctx context.Context, p principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

func principalFrom(ctx context.Context) principal {
	p, _ := ctx.Value(principalKey{}).(principal)
	return p
}
