# Builds the operator image: exactly the binaries `make build` builds — the
# manager, the Redis entrypoint gate (which an init container of every
# managed Redis pod copies out of this image), the in-pod agent and the
# kubectl plugin kubectl-redlock (to copy out: docs/tasks/kubectl-plugin.md)
# — static, stamped with VERSION,
# on a distroless base. Multi-arch: the builder runs on the build platform
# and cross-compiles for TARGETOS/TARGETARCH (`make docker-buildx`).
# test/manifests checks this file against the Makefile, and `make e2e`
# checks the image the local cluster runs against it.
FROM --platform=$BUILDPLATFORM golang:1.26 AS builder
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
WORKDIR /workspace
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY controllers/ controllers/
COPY internal/ internal/
COPY pkg/ pkg/
ENV CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH}
RUN go build -trimpath -ldflags "-s -w -X github.com/redlock-operator/redlock-operator/internal/version.Version=${VERSION}" -o /out/manager ./cmd/manager
RUN go build -trimpath -ldflags "-s -w -X github.com/redlock-operator/redlock-operator/internal/version.Version=${VERSION}" -o /out/gate ./cmd/gate
RUN go build -trimpath -ldflags "-s -w -X github.com/redlock-operator/redlock-operator/internal/version.Version=${VERSION}" -o /out/agent ./cmd/agent
RUN go build -trimpath -ldflags "-s -w -X github.com/redlock-operator/redlock-operator/internal/version.Version=${VERSION}" -o /out/kubectl-redlock ./cmd/kubectl-redlock

FROM gcr.io/distroless/static:nonroot
WORKDIR /
COPY --from=builder /out/manager /manager
COPY --from=builder /out/gate /gate
COPY --from=builder /out/agent /agent
COPY --from=builder /out/kubectl-redlock /kubectl-redlock
USER 65532:65532
ENTRYPOINT ["/manager"]
