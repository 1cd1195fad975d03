package library

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/server/auth"
)

// openShared opens n libraries on one directory, as n servers sharing it would: they
// exclude each other only through the file locks (flock's locks belong to an open file, so
// two in one process exclude each other like two processes).
func openShared(t *testing.T, dir string, n int) []*Library {
	t.Helper()
	var ls []*Library
	for range n {
		l, warn, err := Open(dir)
		if err != nil || len(warn) > 0 {
			t.Fatal(err, warn)
		}
		t.Cleanup(func() { l.Close() })
		// A process of its own has its own in-process lock: only the file lock is shared.
		l.commit = new(sync.Mutex)
		ls = append(ls, l)
	}
	return ls
}

// Two libraries on one directory (two processes on a shared volume; flock treats two opens
// in one process like two processes) see each other's uploads and deletes at once, with
// the same metadata and audio, also after the directory's time has settled.
func TestTwoLibrariesSeeEachOther(t *testing.T) {
	dir := t.TempDir()
	ls := openShared(t, dir, 2)
	a, b := ls[0], ls[1]
	if got := b.List(auth.Admin); len(got) != 0 {
		t.Fatalf("empty library lists %v", got)
	}
	v, err := a.Add("k_alice", "Alice", toneWAV(t, 2, 0.5))
	if err != nil {
		t.Fatal(err)
	}
	if got := b.List("k_alice"); len(got) != 1 || got[0] != v {
		t.Fatalf("the other library lists %v, want [%v]", got, v)
	}
	for _, key := range []string{v.ID, "Alice"} {
		if got, err := b.Get("k_alice", key); err != nil || got != v {
			t.Errorf("Get(%s) in the other library: %v %v", key, got, err)
		}
	}
	ca, ra, errA := a.Clip("k_alice", v.ID)
	cb, rb, errB := b.Clip("k_alice", v.ID)
	if errA != nil || errB != nil || ra != rb || !slices.Equal(ca, cb) {
		t.Errorf("clips differ: %d at %d (%v), %d at %d (%v)", len(ca), ra, errA, len(cb), rb, errB)
	}
	if _, err := b.Get("k_bob", v.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("another owner sees the voice: %v", err)
	}
	// The name is taken in the other library too; another owner may use it.
	if _, err := b.Add("k_alice", " Alice ", toneWAV(t, 2, 0.4)); !errors.Is(err, ErrNameTaken) {
		t.Errorf("duplicate name through the other library: %v", err)
	}
	if _, err := b.Add("k_bob", "Alice", toneWAV(t, 2, 0.4)); err != nil {
		t.Errorf("another owner's Alice: %v", err)
	}
	// A delete in one is seen by the other: listing, lookup and audio.
	if err := b.Delete("k_alice", v.ID); err != nil {
		t.Fatal(err)
	}
	if got := a.List("k_alice"); len(got) != 0 {
		t.Errorf("deleted voice still listed by the other library: %v", got)
	}
	if _, err := a.Get("k_alice", "Alice"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get of a voice deleted by the other library: %v", err)
	}
	if _, _, err := a.Clip("k_alice", v.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("Clip of a voice deleted by the other library: %v", err)
	}
	if err := a.Delete("k_alice", v.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("second delete: %v", err)
	}

	// With the directory's time settled (seconds old), a library trusts an unchanged time
	// and skips the listing; a change by the other library moves the time on.
	old := time.Now().Add(-time.Minute)
	if err := os.Chtimes(dir, old, old); err != nil {
		t.Fatal(err)
	}
	a.List(auth.Admin)
	a.mu.Lock()
	trusty := a.scanned.trusty
	a.mu.Unlock()
	if !trusty {
		t.Fatal("a directory a minute old is not trusted")
	}
	w, err := b.Add("k_alice", "Later", toneWAV(t, 2, 0.5))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Get("k_alice", "Later"); err != nil {
		t.Errorf("upload after a settled scan not seen: %v", err)
	}
	if err := os.Chtimes(dir, old, old); err != nil {
		t.Fatal(err)
	}
	a.List(auth.Admin)
	if err := b.Delete("k_alice", w.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Get("k_alice", w.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("delete after a settled scan not seen: %v", err)
	}
}

// Uploads racing through two libraries: one name for one owner is stored once, and the cap
// holds across both (exactly MaxVoices of many distinct uploads succeed).
func TestTwoLibrariesShareNamesAndCap(t *testing.T) {
	ls := openShared(t, t.TempDir(), 2)
	clip := toneWAV(t, 1.5, 0.5)
	var wg sync.WaitGroup
	var mu sync.Mutex
	won, taken := 0, 0
	for i := range 12 {
		wg.Go(func() {
			_, err := ls[i%2].Add("k_bob", "Bob", clip)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won++
			case errors.Is(err, ErrNameTaken):
				taken++
			default:
				t.Errorf("racing upload: %v", err)
			}
		})
	}
	wg.Wait()
	if won != 1 || taken != 11 {
		t.Errorf("racing uploads of one name: %d stored, %d refused", won, taken)
	}

	for _, l := range ls {
		l.MaxVoices = 5
	}
	created := 0
	for i := range 16 {
		wg.Go(func() {
			_, err := ls[i%2].Add("k_bob", fmt.Sprint("voice ", i), clip)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				created++
			case !errors.Is(err, ErrFull):
				t.Errorf("upload %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if created != 4 {
		t.Errorf("%d uploads succeeded after Bob; the cap of 5 leaves room for 4", created)
	}
	for i, l := range ls {
		if n := len(l.List(auth.Admin)); n != 5 {
			t.Errorf("library %d lists %d voices, want 5", i, n)
		}
	}
}

// Uploads and deletes through both libraries at once lose nothing: every acknowledged
// upload not deleted is listed by both with the same metadata, every delete is gone from
// both, and the directory holds exactly those voices, each clip with its metadata.
func TestTwoLibrariesConcurrentUploadsAndDeletes(t *testing.T) {
	dir := t.TempDir()
	ls := openShared(t, dir, 2)
	clip := toneWAV(t, 1.2, 0.5)
	var mu sync.Mutex
	acked := map[string]Voice{}
	deleted := map[string]bool{}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := range 15 {
				owner := []string{"k_a", "k_b"}[w%2]
				v, err := ls[w%2].Add(owner, fmt.Sprintf("w%d-%d", w, i), clip)
				if err != nil {
					t.Errorf("upload: %v", err)
					continue
				}
				mu.Lock()
				acked[v.ID] = v
				var victim string
				if rng.IntN(2) == 0 { // delete one of this owner's, through the other library
					for id, o := range acked {
						if !deleted[id] && o.Owner == owner {
							victim = id
							deleted[id] = true
							break
						}
					}
				}
				mu.Unlock()
				if victim != "" {
					if err := ls[(w+1)%2].Delete(owner, victim); err != nil {
						t.Errorf("delete %s: %v", victim, err)
					}
				}
			}
		})
	}
	wg.Wait()
	for i, l := range ls {
		listed := map[string]Voice{}
		for _, v := range l.List(auth.Admin) {
			listed[v.ID] = v
		}
		for id, v := range acked {
			got, ok := listed[id]
			switch {
			case deleted[id] && ok:
				t.Errorf("library %d lists deleted %s", i, id)
			case !deleted[id] && got != v:
				t.Errorf("library %d: acknowledged %v listed as %v", i, v, got)
			}
		}
		if want := len(acked) - len(deleted); len(listed) != want {
			t.Errorf("library %d lists %d voices, want %d", i, len(listed), want)
		}
	}
	files, _ := filepath.Glob(filepath.Join(dir, "v_*"))
	if want := 2 * (len(acked) - len(deleted)); len(files) != want {
		t.Errorf("%d voice files in the directory, want %d", len(files), want)
	}
	t.Logf("%d uploads, %d deleted", len(acked), len(deleted))
}

// While another library has the directory open, Open removes only leftovers old enough
// not to be that library's upload in progress; once it is closed, all of them.
func TestOpenSparesLeftoversOfAnotherProcess(t *testing.T) {
	dir := t.TempDir()
	first := openShared(t, dir, 1)[0]
	write := func(name string, age time.Duration) {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, toneWAV(t, 1.5, 0.5), 0o600); err != nil {
			t.Fatal(err)
		}
		at := time.Now().Add(-age)
		os.Chtimes(p, at, at)
	}
	write(".tmp-fresh", 0)
	write("v_5555555555555555.wav", time.Second)
	write(".tmp-old", 2*time.Hour)
	write("v_6666666666666666.wav", 2*time.Hour)
	exists := func(name string) bool {
		_, err := os.Stat(filepath.Join(dir, name))
		return err == nil
	}
	second, warn, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !exists(".tmp-fresh") || !exists("v_5555555555555555.wav") || exists(".tmp-old") || exists("v_6666666666666666.wav") {
		t.Errorf("with another process: warnings %q", warn)
	}
	if len(warn) != 2 || !strings.Contains(strings.Join(warn, "\n"), ".tmp-old: removed") {
		t.Errorf("warnings %q", warn)
	}
	first.Close()
	second.Close()
	third, warn, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	if exists(".tmp-fresh") || exists("v_5555555555555555.wav") || len(warn) != 2 {
		t.Errorf("alone: warnings %q", warn)
	}
}

// BenchmarkList1000: listing a full library, when the directory is unchanged (settled: an
// open and a stat) and when another process just changed it (a new listing).
func BenchmarkList1000(b *testing.B) {
	dir := b.TempDir()
	clip := toneWAV(b, 1, 0.5)
	for i := range 1000 {
		id := fmt.Sprintf("v_%016x", i)
		meta := fmt.Sprintf(`{"id":%q,"name":"n%d","owner":"k_x","sample_rate":16000,"seconds":1,"created":"2025-01-01T00:00:00Z"}`, id, i)
		os.WriteFile(filepath.Join(dir, id+".wav"), clip, 0o600)
		os.WriteFile(filepath.Join(dir, id+".json"), []byte(meta), 0o600)
	}
	l, _, err := Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	old := time.Now().Add(-time.Minute)
	os.Chtimes(dir, old, old)
	b.Run("unchanged", func(b *testing.B) {
		for b.Loop() {
			if len(l.List("k_x")) != 1000 {
				b.Fatal("short")
			}
		}
	})
	b.Run("changed", func(b *testing.B) {
		for b.Loop() {
			os.Chtimes(dir, old, old.Add(time.Duration(b.N)))
			l.mu.Lock()
			l.scanned.info = nil
			l.mu.Unlock()
			if len(l.List("k_x")) != 1000 {
				b.Fatal("short")
			}
		}
	})
}
