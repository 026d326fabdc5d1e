module github.com/redlock-operator/redlock-operator/hack/bench

go 1.26.0

require (
	github.com/redis/go-redis/v9 v9.23.0
	github.com/redlock-operator/redlock-operator v0.0.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/go-redsync/redsync/v4 v4.18.1
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

replace github.com/redlock-operator/redlock-operator => ../..
