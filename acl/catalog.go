package acl

// Catalog is what the write rules look up in the state: a request names a
// session or a service by id, while rules name nodes and services.
type Catalog interface {
	// SessionNode returns the node of session id, "" if unknown.
	SessionNode(id string) string
	// ServiceName returns the name of service id on node, "" if unknown.
	ServiceName(node, id string) string
	// CheckService returns the service name a check on node watches, ""
	// for a node-level or unknown check.
	CheckService(node, checkID string) string
}
