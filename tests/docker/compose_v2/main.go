// compose_v2 prints a compose file as Docker Compose v2 reads it: compose-go, the loader of
// `docker compose` (v2 and later; `docker compose config` prints the same), with the shell's
// environment and the .env file of the project directory (the compose file's). No engine and
// no compose plugin needed; tests/docker/test_config_files.py compares it with compose v1's
// `docker-compose config`.
//
// Usage: go run . COMPOSE_FILE [PROFILE...]
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/compose-spec/compose-go/v2/cli"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: compose_v2 COMPOSE_FILE [PROFILE...]")
		os.Exit(2)
	}
	opts, err := cli.NewProjectOptions(os.Args[1:2], cli.WithOsEnv, cli.WithEnvFiles(),
		cli.WithDotEnv, cli.WithName("streamrank"), cli.WithProfiles(os.Args[2:]))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	project, err := opts.LoadProject(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out, err := project.MarshalYAML()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Stdout.Write(out)
}
