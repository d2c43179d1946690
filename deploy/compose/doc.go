// Package compose holds the test of the compose cluster in this directory
// (docker-compose.yml, brought up by make compose-up): it builds the image,
// starts the cluster, and checks that writes survive a killed leader, a
// partitioned server and a rolling restart onto a new image, while the
// gateway keeps serving. It needs Docker, docker-compose, make and root,
// and skips without them.
package compose
