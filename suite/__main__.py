from suite.cli import console

console()
