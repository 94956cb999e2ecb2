// A Go program with a contended sync.Mutex (tests/test_gosym.py): many goroutines
// over GOMAXPROCS threads take one mutex around hotSpin, so the work is named
// main.hotSpin and the mutex's waiters park their threads in futex waits.
// Prints "ready", exits when stdin is closed or after SECONDS (first argument).
package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"
)

var (
	mu    sync.Mutex
	total uint64
)

//go:noinline
func hotSpin(n int) uint64 {
	var x uint64
	for i := 0; i < n; i++ {
		x += uint64(i) * 7
	}
	return x
}

func worker() {
	for {
		mu.Lock()
		total += hotSpin(20000)
		mu.Unlock()
		time.Sleep(50 * time.Microsecond)
	}
}

func main() {
	seconds := 60.0
	if len(os.Args) > 1 {
		seconds, _ = strconv.ParseFloat(os.Args[1], 64)
	}
	runtime.GOMAXPROCS(4)
	for i := 0; i < 64; i++ {
		go worker()
	}
	fmt.Println("ready")
	go func() {
		buf := make([]byte, 64)
		for {
			if n, err := os.Stdin.Read(buf); n == 0 || err != nil {
				os.Exit(0)
			}
		}
	}()
	time.Sleep(time.Duration(seconds * float64(time.Second)))
}
