module lamina.invalid/chug-json

go 1.19

require code.cloudfoundry.org/lager/v3 v3.0.3

require (
	github.com/go-task/slim-sprig v0.0.0-20230315185526-52ccab3ef572 // indirect
	github.com/google/pprof v0.0.0-20210407192527-94a9f03dee38 // indirect
	github.com/onsi/ginkgo/v2 v2.13.2 // indirect
	github.com/openzipkin/zipkin-go v0.4.2 // indirect
	golang.org/x/tools v0.14.0 // indirect
)
