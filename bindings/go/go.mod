module github.com/pymq/pymq/bindings/go

go 1.19
