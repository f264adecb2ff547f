package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// decodeStrict decodes one JSON value into v, refusing unknown fields,
// wrong types and trailing data.
func decodeStrict(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return fmt.Errorf("%w: empty body, expected a JSON object", ErrBadRequest)
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
	return nil
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
