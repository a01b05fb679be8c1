package fittext

import "strings"

// SequenceRatio is Python difflib's SequenceMatcher(None, a, b).ratio():
// 2·M / (len(a) + len(b)) over code points, M the characters of the
// matching blocks Ratcliff/Obershelp finds (the longest common block, then
// recursively on either side of it), with difflib's "autojunk": when b has
// 200 characters or more, a character occurring in b more than
// len(b)/100 + 1 times cannot start a match (it may extend one). FitText's
// duplicate check compares with it at 0.82, so the heuristic has to be
// difflib's to the letter.
func SequenceRatio(a, b string) float64 {
	ra, rb := []rune(a), []rune(b)
	if len(ra)+len(rb) == 0 {
		return 1
	}
	b2j := map[rune][]int{}
	for j, c := range rb {
		b2j[c] = append(b2j[c], j)
	}
	if n := len(rb); n >= 200 {
		ntest := n/100 + 1
		for c, js := range b2j {
			if len(js) > ntest {
				delete(b2j, c)
			}
		}
	}
	longest := func(alo, ahi, blo, bhi int) (int, int, int) {
		besti, bestj, best := alo, blo, 0
		j2len := map[int]int{}
		for i := alo; i < ahi; i++ {
			next := map[int]int{}
			for _, j := range b2j[ra[i]] {
				if j < blo {
					continue
				}
				if j >= bhi {
					break
				}
				k := j2len[j-1] + 1
				next[j] = k
				if k > best {
					besti, bestj, best = i-k+1, j-k+1, k
				}
			}
			j2len = next
		}
		// No character is junk (isjunk is None), so a match extends over
		// equal neighbours, popular ones included.
		for besti > alo && bestj > blo && ra[besti-1] == rb[bestj-1] {
			besti, bestj, best = besti-1, bestj-1, best+1
		}
		for besti+best < ahi && bestj+best < bhi && ra[besti+best] == rb[bestj+best] {
			best++
		}
		return besti, bestj, best
	}
	type span struct{ alo, ahi, blo, bhi int }
	queue := []span{{0, len(ra), 0, len(rb)}}
	matched := 0
	for len(queue) > 0 {
		s := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		i, j, k := longest(s.alo, s.ahi, s.blo, s.bhi)
		if k == 0 {
			continue
		}
		matched += k
		if s.alo < i && s.blo < j {
			queue = append(queue, span{s.alo, i, s.blo, j})
		}
		if i+k < s.ahi && j+k < s.bhi {
			queue = append(queue, span{i + k, s.ahi, j + k, s.bhi})
		}
	}
	return 2 * float64(matched) / float64(len(ra)+len(rb))
}

// Duplicate is FitText's test of Eq. 9: a pseudo-tool repeats one of the
// remembered intents when their SequenceRatio reaches 0.82 or it is
// contained in one. It returns the first such entry.
func (m Probes) Duplicate(d string) (Probe, bool) {
	for _, e := range m {
		if SequenceRatio(d, e.Intent) >= duplicateRatio || strings.Contains(e.Intent, d) {
			return e, true
		}
	}
	return Probe{}, false
}

const duplicateRatio = 0.82
