//go:build !race

package rls

// raceEnabled reports a -race build (see race_test.go).
const raceEnabled = false
