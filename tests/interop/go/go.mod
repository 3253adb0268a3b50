module github.com/pymq/pymq/tests/interop/go

go 1.19

require github.com/go-stomp/stomp/v3 v3.1.3
