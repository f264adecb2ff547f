// Package auth holds mqd's access tokens: the token file (--auth-file) with
// SHA-256 hashes of the secrets, the permissions they grant, topic globs,
// and the check a request's bearer token passes or fails.
//
// It does not know about HTTP routes (the api package says which permission
// each route needs) nor about TLS (package tlsconf).
package auth
