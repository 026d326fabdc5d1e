// Package conditions holds what the controllers share about the conditions
// they write.
package conditions

// maxMessage is the longest condition message the controllers write.
const maxMessage = 1024

// Message returns s cut to what a condition comfortably shows.
func Message(s string) string {
	if len(s) > maxMessage {
		return s[:maxMessage-3] + "..."
	}
	return s
}
