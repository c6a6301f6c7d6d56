// Command synapse is a single-binary, Kafka-wire-compatible broker with a
// two-tier log. Run `synapse --help` for the subcommands.
package main

import (
	"os"
)

func main() {
	// Cobra has already printed the error (to stderr) by the time Execute
	// returns it; all that is left is the exit status: 1, or 2 for a usage
	// error (exitStatus).
	os.Exit(exitStatus(newRootCommand().ExecuteC()))
}
