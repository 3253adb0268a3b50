module github.com/pymq/pymq-go

go 1.19
