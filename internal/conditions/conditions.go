// Package conditions holds what the controllers share about the conditions
// they write, on their own objects and on pods, and about the problem
// annotation by which they tell a pod why it cannot take part.
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
