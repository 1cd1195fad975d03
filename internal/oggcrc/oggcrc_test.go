package oggcrc

import "testing"

// Ogg's CRC (init 0, no reflection, no final xor) has the check value 0x89A1897F, and
// continues over pieces.
func TestUpdateKnownValue(t *testing.T) {
	if got := Update(0, []byte("123456789")); got != 0x89A1897F {
		t.Fatalf("Update(0, \"123456789\") = %#x, want 0x89a1897f", got)
	}
	if Update(Update(0, []byte("1234")), []byte("56789")) != Update(0, []byte("123456789")) {
		t.Fatal("Update does not continue over pieces")
	}
}
