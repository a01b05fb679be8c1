// Package jsonerr says in a user's words what encoding/json found wrong in
// a document: which field holds which JSON kind where another belongs,
// where the decoder's own message names Go's structs and types.
package jsonerr

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// Type describes err when it is a *json.UnmarshalTypeError: field is the
// value's path as the document spells it ("" for the document or an element
// of a top-level array, which the decoder does not tell apart), msg
// says what is there and what belongs. Path segments named in embedded
// (Go's names of embedded structs, which the decoder puts in the path) are
// dropped.
func Type(err error, embedded ...string) (field, msg string, ok bool) {
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) {
		return "", "", false
	}
	if te.Field == "" {
		return "", fmt.Sprintf("a JSON %s stands where %s belongs", te.Value, kind(te.Type)), true
	}
	field = strings.Join(slices.DeleteFunc(strings.Split(te.Field, "."), func(s string) bool {
		return slices.Contains(embedded, s)
	}), ".")
	return field, fmt.Sprintf("%s is a JSON %s where %s belongs", field, te.Value, kind(te.Type)), true
}

// kind names a Go type as the JSON that decodes into it.
func kind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Pointer:
		return kind(t.Elem())
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	}
	return "a " + t.String()
}

// Explain is err in a user's words when it is a type error (Type's
// message), otherwise err itself.
func Explain(err error, embedded ...string) error {
	if _, msg, ok := Type(err, embedded...); ok {
		return errors.New(msg)
	}
	return err
}
