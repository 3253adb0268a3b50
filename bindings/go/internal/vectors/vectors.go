// Package vectors finds and loads the language-neutral test vectors of spec/vectors/ for the tests.
//
// The directory is $PYMQ_SPEC_VECTORS when set, else the first spec/vectors found walking up from the
// working directory (go test runs in the package directory, inside the pymq repository).
//
// Every file loaded is appended, one name per line, to $PYMQ_VECTORS_REPORT when it is set:
// tests/bindings/test_vector_coverage.py compares that list with spec/vectors/bindings.json, so a vector
// file that this binding neither runs nor declares not applicable fails CI.
package vectors

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
)

// Dir returns the spec/vectors directory.
func Dir() (string, error) {
	if d := os.Getenv("PYMQ_SPEC_VECTORS"); d != "" {
		return d, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		candidate := filepath.Join(dir, "spec", "vectors")
		if st, err := os.Stat(candidate); err == nil && st.IsDir() {
			return candidate, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("spec/vectors not found above the working directory; set PYMQ_SPEC_VECTORS")
		}
		dir = parent
	}
}

// Load decodes spec/vectors/<name> into v.
func Load(name string, v any) error {
	dir, err := Dir()
	if err != nil {
		return err
	}
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return err
	}
	return record(name)
}

// record appends name to $PYMQ_VECTORS_REPORT (packages run in parallel processes: one short O_APPEND
// write per line keeps the lines whole).
func record(name string) error {
	report := os.Getenv("PYMQ_VECTORS_REPORT")
	if report == "" {
		return nil
	}
	f, err := os.OpenFile(report, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(name + "\n"); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
