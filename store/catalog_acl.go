package store

// The lookups the ACL write rules make (acl.Catalog): requests name
// sessions and services by id, rules name nodes and services.

// SessionNode returns the node of session id, "" if unknown.
func (s *Store) SessionNode(id string) string {
	se, _ := s.Session(id)
	return se.GetNode()
}

// ServiceName returns the name of service id on node, "" if unknown.
func (s *Store) ServiceName(node, id string) string {
	ns, _ := s.Node(node)
	for _, svc := range ns.GetServices() {
		if svc.Id == id {
			return svc.Name
		}
	}
	return ""
}

// CheckService returns the name of the service a check on node watches,
// "" for a node-level or unknown check.
func (s *Store) CheckService(node, checkID string) string {
	cs, _ := s.NodeChecks(node)
	for _, c := range cs {
		if c.CheckId == checkID {
			return c.ServiceName
		}
	}
	return ""
}
