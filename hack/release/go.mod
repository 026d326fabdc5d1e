module github.com/redlock-operator/redlock-operator/hack/release

go 1.26.0

require (
	github.com/google/go-containerregistry v0.22.1
	sigs.k8s.io/yaml v1.6.0
)

require (
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
	go.yaml.in/yaml/v2 v2.4.2 // indirect
	golang.org/x/sync v0.22.0 // indirect
)
