package main

import (
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
)

// keygenCmd prints a new random gossip key: base64 on one line, the format
// --gossip-key-file reads, so that
//
//	kubectl create secret generic ringlimit-gossip-key --from-literal=gossip.key="$(ringlimit keygen)"
//
// creates the Secret in one command. The key comes from rnd (crypto/rand's
// Reader).
func keygenCmd(args []string, rnd io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("keygen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	size := fs.Int("bytes", 32, "key length in bytes: 16, 24 or 32 (AES-128, -192, -256)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: ringlimit keygen [--bytes 32]\n\nPrints a random gossip key, base64 on one line, for --gossip-key-file.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "keygen: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	switch *size {
	case 16, 24, 32:
	default:
		fmt.Fprintf(stderr, "keygen: --bytes: %d, want 16, 24 or 32\n", *size)
		return 2
	}
	key := make([]byte, *size)
	if _, err := io.ReadFull(rnd, key); err != nil {
		fmt.Fprintf(stderr, "keygen: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, base64.StdEncoding.EncodeToString(key))
	return 0
}
