package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"
)

// envAnnotation marks a flag that has a SYNAPSE_* environment twin; its
// value is the variable's name.
const envAnnotation = "synapse_env"

// envName is the environment twin of a flag: --data-dir ⇔ SYNAPSE_DATA_DIR.
func envName(flag string) string {
	return "SYNAPSE_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// bindEnv gives every flag of fs an environment twin and names it in the
// flag's usage. Call it after the flags are defined.
func bindEnv(fs *pflag.FlagSet) {
	fs.VisitAll(func(f *pflag.Flag) {
		env := envName(f.Name)
		f.Usage += " [env " + env + "]"
		_ = fs.SetAnnotation(f.Name, envAnnotation, []string{env})
	})
}

// applyEnv sets each bound flag of fs that was not given on the command line
// from its environment twin, if that is set and not empty. The command line
// wins over the environment, which wins over the default.
func applyEnv(fs *pflag.FlagSet) error {
	var errs []error
	fs.VisitAll(func(f *pflag.Flag) {
		names := f.Annotations[envAnnotation]
		if len(names) == 0 || f.Changed {
			return
		}
		v, ok := os.LookupEnv(names[0])
		if !ok || v == "" {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Errorf("invalid value %q for %s (--%s): %w", v, names[0], f.Name, err))
		}
	})
	return errors.Join(errs...)
}
