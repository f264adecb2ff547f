package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
)

// decodeStrict decodes one JSON value into v, refusing unknown fields,
// wrong types and trailing data.
func decodeStrict(body []byte, v any) error {
	switch t := bytes.TrimSpace(body); {
	case len(t) == 0:
		return fmt.Errorf("%w: empty body, expected a JSON object", ErrBadRequest)
	case t[0] != '{':
		return fmt.Errorf("%w: expected a JSON object", ErrBadRequest)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return fmt.Errorf("%w: field %q: expected %s, got %s", ErrBadRequest, te.Field, te.Type, te.Value)
		}
		return fmt.Errorf("%w: %s", ErrBadRequest, err.Error())
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: trailing data after the JSON object", ErrBadRequest)
	}
	// encoding/json matches field names case-insensitively; the contract
	// does not ("MAX" is not "max").
	return exactKeys(body, reflect.TypeOf(v), "")
}

// exactKeys checks that every object key in raw is spelled exactly as a
// json tag of the struct type t it decodes into, recursively.
func exactKeys(raw []byte, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		var obj map[string]json.RawMessage
		if json.Unmarshal(raw, &obj) != nil || obj == nil {
			return nil // null, or already refused by the decoder
		}
		for k, v := range obj {
			f, ok := fieldByTag(t, k)
			if !ok {
				return fmt.Errorf("%w: unknown field %q", ErrBadRequest, path+k)
			}
			if err := exactKeys(v, f.Type, path+k+"."); err != nil {
				return err
			}
		}
	case reflect.Slice:
		var elems []json.RawMessage
		if json.Unmarshal(raw, &elems) != nil {
			return nil
		}
		for i, e := range elems {
			if err := exactKeys(e, t.Elem(), fmt.Sprintf("%s%d.", path, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

func fieldByTag(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if tag, _, _ := strings.Cut(f.Tag.Get("json"), ","); tag == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// optBody decodes body into v when it is not empty.
func optBody(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	return decodeStrict(body, v)
}

// checkRange refuses a number outside [lo, hi].
func checkRange(field string, v, lo, hi int64) error {
	if v < lo || v > hi {
		return fmt.Errorf("%w: %s must be in [%d, %d], got %d", ErrBadRequest, field, lo, hi, v)
	}
	return nil
}

// decodeLoose decodes what it can, ignoring unknown fields and errors.
func decodeLoose(body []byte, v any) error { return json.Unmarshal(body, v) }
