// Package systest holds what the black-box system test packages under test/
// share on top of internal/testcluster: publishing and consuming through a
// cluster with retries, traffic that runs across a rolling upgrade, the CLI
// and the binary run as a user runs them, the console driven in Chromium,
// metrics scraped and compared, placement and data-group views, and the
// checks that nothing acknowledged was lost or delivered twice. Everything
// here reaches mqd through its public surface (HTTP, the binary, its files).
package systest
