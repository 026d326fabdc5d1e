package conditions

import (
	"strings"
	"testing"
)

func TestMessage(t *testing.T) {
	if got := Message("short"); got != "short" {
		t.Errorf("a short message changed: %q", got)
	}
	long := strings.Repeat("x", 5000)
	if got := Message(long); len(got) != maxMessage || !strings.HasSuffix(got, "...") {
		t.Errorf("a long message: %d bytes ending %q, want %d ending ...", len(got), got[len(got)-3:], maxMessage)
	}
}
