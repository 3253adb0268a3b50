module github.com/pymq/pymq/bench/goload

go 1.19

require github.com/go-stomp/stomp/v3 v3.1.3
