package cluster

import (
	"time"

	"github.com/agemem/agemem/internal/valid"
)

// Config is how the ranks of a run talk (config section "cluster"); it
// matters only when a launcher starts more than one rank.
type Config struct {
	// Port is rank 0's control endpoint (0: the launcher's MASTER_PORT, or
	// the port after it under torchrun, whose agent holds MASTER_PORT).
	Port int `yaml:"port"`
	// DataPort is where each rank accepts its ring neighbour (0: a free
	// port, which the rendezvous tells the others).
	DataPort int `yaml:"data_port"`
	// Heartbeat is how often each rank tells rank 0 it is alive.
	Heartbeat time.Duration `yaml:"heartbeat"`
	// Timeout is how long a silent rank (or an unreachable rank 0) is
	// given before the run stops with an error naming it.
	Timeout time.Duration `yaml:"timeout"`
	// Rendezvous bounds the wait for every rank to join (machines start
	// at different times; torchrun waits 900 s).
	Rendezvous time.Duration `yaml:"rendezvous"`
	// Collective bounds one send or receive of a gradient all-reduce: a
	// rank connected but silent that long is taken to hang (PyTorch's
	// NCCL watchdog waits 30 minutes).
	Collective time.Duration `yaml:"collective"`
}

// DefaultConfig: heartbeats every 2 s, a rank silent for 60 s stops the
// run, 15 minutes to gather, 30 minutes for a collective.
func DefaultConfig() Config {
	return Config{Heartbeat: 2 * time.Second, Timeout: time.Minute, Rendezvous: 15 * time.Minute, Collective: 30 * time.Minute}
}

// Validate checks every key.
func (c Config) Validate() error {
	var e valid.Errors
	port := func(key string, v int) {
		if v < 0 || v > 65535 {
			e.Add(key, "%d is not a TCP port (0: the default)", v)
		}
	}
	port("port", c.Port)
	port("data_port", c.DataPort)
	pos := func(key string, d time.Duration) {
		if d <= 0 {
			e.Add(key, "%v must be positive", d)
		}
	}
	pos("heartbeat", c.Heartbeat)
	pos("timeout", c.Timeout)
	pos("rendezvous", c.Rendezvous)
	pos("collective", c.Collective)
	if c.Heartbeat > 0 && c.Timeout > 0 && c.Timeout < 2*c.Heartbeat {
		e.Add("timeout", "%v is under two heartbeats (%v): a live rank would be taken for dead", c.Timeout, c.Heartbeat)
	}
	return e.Err()
}
