package rl

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Validated is a step's validation score.
type Validated struct {
	Step int     `json:"step"`
	J    float64 `json:"j"`
	SE   float64 `json:"se"`
}

// validation tracks the best validated step of a run in out/best.json,
// so a resumed run keeps comparing against it; with rl.keep_best its
// weights wait in out/best-policy until the run ends.
type validation struct {
	out  string
	best Validated
}

func newValidation(out string, resumed, keep bool) (*validation, error) {
	v := &validation{out: out}
	file := filepath.Join(out, "best.json")
	if !resumed {
		// A fresh run in an old run's folder: its best is not this run's.
		for _, p := range []string{file, filepath.Join(out, "best-policy")} {
			if err := os.RemoveAll(p); err != nil {
				return nil, err
			}
		}
		return v, nil
	}
	b, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return v, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &v.best); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if _, err := os.Stat(filepath.Join(out, "best-policy")); keep && err != nil {
		// The run before kept no weights (rl.keep_best was off): only
		// steps validated from here on can be installed.
		v.best = Validated{}
	}
	return v, nil
}

// offer records step n's score; when it beats the best so far (ties keep
// the earlier step) and keep is set, the policy exported to dir becomes
// out/best-policy, otherwise dir is removed.
func (v *validation) offer(n int, j, se float64, dir string, keep bool) error {
	better := v.best.Step == 0 || j > v.best.J
	if better {
		v.best = Validated{Step: n, J: j, SE: se}
		b, err := json.Marshal(v.best)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(v.out, "best.json"), append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if !better || !keep {
		return os.RemoveAll(dir)
	}
	bestDir := filepath.Join(v.out, "best-policy")
	if err := os.RemoveAll(bestDir); err != nil {
		return err
	}
	return os.Rename(dir, bestDir)
}

// install moves the best step's weights to policy.
func (v *validation) install(policy string) error {
	bestDir := filepath.Join(v.out, "best-policy")
	if _, err := os.Stat(bestDir); err != nil {
		return fmt.Errorf("rl.keep_best: the weights of step %d (%s) are gone: %w", v.best.Step, bestDir, err)
	}
	if err := os.RemoveAll(policy); err != nil {
		return err
	}
	return os.Rename(bestDir, policy)
}
